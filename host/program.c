/* Program assembly, lazy compilation and the binary cache.
 * Source = feature defines + common.cl + the family's .cl; tuned values arrive as -D options and
 * are part of the cache key.  CASTLE_CL_DIR=<dir> loads the .cl files from disk (development). */
#include "program.h"
#include "context.h"
#include "bincache.h"
#include "error.h"
#include "tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const family_files[CASTLE_FAMILY_COUNT] = {
    [CASTLE_FAMILY_FORWARD] = "forward.cl",
    [CASTLE_FAMILY_BACKWARD] = "backward.cl",
    [CASTLE_FAMILY_CACHE] = "cache.cl",
    [CASTLE_FAMILY_CAUSAL] = "causal.cl",
};

/* Returns malloc'd contents of cl/<name>, from CASTLE_CL_DIR or the embedded copy. */
static char *load_source(const char *name)
{
    const char *dir = getenv("CASTLE_CL_DIR");
    if (dir && *dir) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, name);
        FILE *f = fopen(path, "rb");
        if (f) {
            char *buf = NULL;
            long n = -1;
            if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
                (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
                buf[n] = '\0';
                fclose(f);
                return buf;
            }
            free(buf);
            fclose(f);
        }
    }
    const char *src = castle__embedded_source(name);
    if (!src)
        return NULL;
    size_t n = strlen(src);
    char *buf = malloc(n + 1);
    if (buf)
        memcpy(buf, src, n + 1);
    return buf;
}

castle_status castle__program_source(castle_family f, const castle_tuning *t, char **source, char **options)
{
    *source = *options = NULL;
    char *common = load_source("common.cl");
    char *body = load_source(family_files[f]);
    static const char prelude[] = "/* libcastle */\n";
    if (!common || !body) {
        free(common);
        free(body);
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "cannot load kernel source %s", family_files[f]);
    }
    size_t n = strlen(prelude) + strlen(common) + strlen(body) + 2;
    char *src = malloc(n);
    char *opt = malloc(256);
    if (!src || !opt) {
        free(common);
        free(body);
        free(src);
        free(opt);
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "out of host memory assembling %s", family_files[f]);
    }
    snprintf(src, n, "%s%s\n%s", prelude, common, body);
    snprintf(opt, 256, "-cl-std=CL1.2 -DBLK=%u -DNT=%u -DDT=%u -DVW=%u", t->block, t->threads, t->dchunk, t->vector);
    free(common);
    free(body);
    *source = src;
    *options = opt;
    return CASTLE_SUCCESS;
}

/* Makes text the context's newest build log (the caller holds the lock).  A log equal to the
   newest is not stored twice, so a build that keeps failing the same way does not grow the list. */
static void set_log(castle_context *ctx, const char *text, size_t n)
{
    if (ctx->logs && strlen(ctx->logs->text) == n && !memcmp(ctx->logs->text, text, n))
        return;
    castle_log *log = malloc(sizeof *log + n + 1);
    if (!log)
        return;
    memcpy(log->text, text, n);
    log->text[n] = '\0';
    log->older = ctx->logs;
    ctx->logs = log;
}

static void keep_log(castle_context *ctx, cl_program prog)
{
    size_t n = 0;
    if (clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS)
        n = 0;
    char *log = malloc(n + 1);
    if (!log)
        return;
    if (n == 0 || clGetProgramBuildInfo(prog, ctx->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS)
        n = 0;
    log[n] = '\0';
    set_log(ctx, log, strlen(log));
    free(log);
}

/* Tries the binary cache; returns a built program or NULL. */
static cl_program from_cache(castle_context *ctx, const char *const *key, int nkey)
{
    unsigned char *bin = NULL;
    size_t len = 0;
    if (!castle__bincache_load(key, nkey, &bin, &len))
        return NULL;
    cl_int err, bstatus;
    const unsigned char *bins[1] = {bin};
    cl_program prog = clCreateProgramWithBinary(ctx->cl_ctx, 1, &ctx->device, &len, bins, &bstatus, &err);
    free(bin);
    if (!prog)
        return NULL;
    if (err != CL_SUCCESS || bstatus != CL_SUCCESS || clBuildProgram(prog, 1, &ctx->device, key[1], NULL, NULL) != CL_SUCCESS) {
        clReleaseProgram(prog);
        return NULL;
    }
    return prog;
}

static void to_cache(cl_program prog, const char *const *key, int nkey)
{
    size_t len = 0;
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) != CL_SUCCESS || len == 0)
        return;
    unsigned char *bin = malloc(len);
    if (!bin)
        return;
    unsigned char *bins[1] = {bin};
    if (clGetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS)
        castle__bincache_store(key, nkey, bin, len);
    free(bin);
}

/* Index of the program of family f under the current tuning, building it on first use. */
static castle_status get_program(castle_context *ctx, castle_family f, int *index)
{
    for (int i = 0; i < ctx->num_programs; ++i) {
        const castle_program_slot *s = &ctx->programs[i];
        if (s->family == f && !memcmp(&s->tuning, &ctx->tuning, sizeof s->tuning)) {
            *index = i;
            return CASTLE_SUCCESS;
        }
    }
    if (ctx->num_programs == CASTLE_MAX_PROGRAMS)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "more than %d kernel programs on one context",
                            CASTLE_MAX_PROGRAMS);
    char *src, *opt;
    castle_status st = castle__program_source(f, &ctx->tuning, &src, &opt);
    if (st != CASTLE_SUCCESS)
        return st;
    const castle_device_info *in = &ctx->info;
    const char *key[] = {src, opt, in->name, in->vendor, in->driver_version, in->device_version, in->platform_version};
    const int nkey = (int)(sizeof key / sizeof key[0]);
    cl_int err = CL_SUCCESS;
    cl_program prog = from_cache(ctx, key, nkey);
    if (prog) {
        static const char cached[] = "program binary loaded from the on-disk cache; nothing compiled\n";
        set_log(ctx, cached, sizeof cached - 1);
    } else {
        const char *srcs[1] = {src};
        prog = clCreateProgramWithSource(ctx->cl_ctx, 1, srcs, NULL, &err);
        if (!prog) {
            free(src);
            free(opt);
            return castle__cl_fail(err, "clCreateProgramWithSource");
        }
        err = clBuildProgram(prog, 1, &ctx->device, opt, NULL, NULL);
        keep_log(ctx, prog);
        if (err != CL_SUCCESS) {
            clReleaseProgram(prog);
            st = castle__fail(CASTLE_ERR_BUILD_FAILED, "building %s with '%s' failed (OpenCL %d); see castle_build_log()",
                              family_files[f], opt, (int)err);
            free(src);
            free(opt);
            return st;
        }
        to_cache(prog, key, nkey);
    }
    free(src);
    free(opt);
    castle_program_slot *s = &ctx->programs[ctx->num_programs];
    s->family = f;
    s->tuning = ctx->tuning;
    s->program = prog;
    *index = ctx->num_programs++;
    return CASTLE_SUCCESS;
}

static castle_status get_kernel(castle_context *ctx, castle_family f, const char *name, cl_kernel *kernel)
{
    int prog = 0;
    castle_status st = get_program(ctx, f, &prog);
    if (st != CASTLE_SUCCESS)
        return st;
    for (int i = 0; i < ctx->num_kernels; ++i)
        if (ctx->kernels[i].program == prog && !strcmp(ctx->kernels[i].name, name)) {
            *kernel = ctx->kernels[i].kernel;
            return CASTLE_SUCCESS;
        }
    if (ctx->num_kernels == CASTLE_MAX_KERNELS)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "more than %d kernels on one context", CASTLE_MAX_KERNELS);
    cl_int err;
    cl_kernel k = clCreateKernel(ctx->programs[prog].program, name, &err);
    if (!k)
        return castle__cl_fail(err, "clCreateKernel");
    castle_kernel_slot *ks = &ctx->kernels[ctx->num_kernels++];
    ks->program = prog;
    ks->name = name;
    ks->kernel = k;
    *kernel = k;
    return CASTLE_SUCCESS;
}

castle_status castle__get_kernel(castle_context *ctx, castle_family f, const char *name, cl_kernel *kernel)
{
    castle__ctx_lock(ctx);
    castle_status st = get_kernel(ctx, f, name, kernel);
    castle__ctx_unlock(ctx);
    return st;
}
