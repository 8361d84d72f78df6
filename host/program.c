/* Program assembly, lazy compilation and the binary cache.
 * Source = local_memory.h + common.cl + the family's .cl; tuned values arrive as -D options and
 * are part of the cache key.  CASTLE_CL_DIR=<dir> loads the .cl files from disk (development). */
#include "program.h"
#include "context.h"
#include "bincache.h"
#include "error.h"
#include "tuning.h"
#include "causal.h" /* CASTLE_DECODE_ROWS, CASTLE_DECODE_GROUP */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The largest kernel source file CASTLE_CL_DIR may hold (the library's own are under 100 KiB). */
#define CASTLE_CL_SOURCE_MAX ((size_t)16 << 20)

/* What distinguishes the families, declared once: the kernel file, the shape the kernels run under
   (castle__family_tuning), whether accum = 2 builds them per head-dimension class
   (castle__head_dim_class), and a build option of the family's own. */
typedef enum family_shape { SHAPE_REST, SHAPE_BACKWARD, SHAPE_FORWARD } family_shape;
static const struct family_info {
    const char *file;
    family_shape shape;
    bool per_class;
    const char *option;
} families[CASTLE_FAMILY_COUNT] = {
    [CASTLE_FAMILY_FORWARD] = {"forward.cl", SHAPE_FORWARD, false, ""},
    [CASTLE_FAMILY_BACKWARD] = {"backward.cl", SHAPE_BACKWARD, false, ""},
    [CASTLE_FAMILY_CACHE] = {"cache.cl", SHAPE_REST, true, ""},
    [CASTLE_FAMILY_CAUSAL] = {"causal.cl", SHAPE_REST, true, ""},
    /* the forward kernel alone: the others need the rest's shape */
    [CASTLE_FAMILY_CAUSAL_FORWARD] = {"causal.cl", SHAPE_FORWARD, true, " -DCC_FORWARD_ONLY=1"},
};

/* Reads cl/<name> into *out (malloc'd): from $CASTLE_CL_DIR when it is set, where a missing or
   unreadable file is an error (never a silent fall-back to the embedded copy), else the copy
   embedded at build time. */
static castle_status load_source(const char *name, char **out)
{
    *out = NULL;
    const char *dir = getenv("CASTLE_CL_DIR");
    if (dir && *dir) {
        char path[4096];
        if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
            return castle__fail(CASTLE_ERR_BUILD_FAILED, "CASTLE_CL_DIR is longer than %zu bytes", sizeof path);
        const char *why = "read error";
        size_t n = 0;
        FILE *f = castle__open_regular(path, CASTLE_CL_SOURCE_MAX, &n, &why);
        char *buf = f ? malloc(n + 1) : NULL;
        if (f && !buf)
            why = "out of host memory";
        const bool ok = buf && fread(buf, 1, n, f) == n;
        if (f)
            fclose(f);
        if (!ok) {
            free(buf);
            return castle__fail(CASTLE_ERR_BUILD_FAILED,
                                "CASTLE_CL_DIR is set but %s cannot be read (%s); unset it to use the embedded "
                                "kernels",
                                path, why);
        }
        buf[n] = '\0';
        *out = buf;
        return CASTLE_SUCCESS;
    }
    const char *src = castle__embedded_source(name);
    if (!src)
        return castle__fail(CASTLE_ERR_BUILD_FAILED, "no embedded kernel source %s", name);
    size_t n = strlen(src);
    char *buf = malloc(n + 1);
    if (!buf)
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "out of host memory loading %s", name);
    memcpy(buf, src, n + 1);
    *out = buf;
    return CASTLE_SUCCESS;
}

castle_tuning castle__family_tuning(castle_family f, const castle_tuning *t)
{
    castle_tuning v = *t;
    if (families[f].shape == SHAPE_BACKWARD) {
        v.threads = t->bthreads;
        v.tm = t->btm;
    } else if (families[f].shape == SHAPE_FORWARD) {
        v.threads = t->fthreads;
        v.dchunk = t->fdchunk;
        v.regs = t->fregs;
    }
    return v;
}

castle_family castle__causal_forward_family(const castle_tuning *t)
{
    return t->fthreads == t->threads && t->fdchunk == t->dchunk && t->fregs == t->regs ? CASTLE_FAMILY_CAUSAL
                                                                                       : CASTLE_FAMILY_CAUSAL_FORWARD;
}

int castle__head_dim_class(castle_family f, const castle_tuning *t, size_t d)
{
    if (t->accum != 2 || !families[f].per_class)
        return CASTLE_MAX_HEAD_DIM;
    int c = 64;
    while ((size_t)c < d && c < CASTLE_MAX_HEAD_DIM)
        c *= 2;
    return c;
}

enum { OPT_BYTES = 1024 };

/* Appends a formatted option to opt (OPT_BYTES long); *used counts what it would take, so that a
   string cut short shows as *used >= OPT_BYTES and nothing is written past the buffer. */
static void opt_add(char *opt, size_t *used, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int w = vsnprintf(opt + (*used < OPT_BYTES ? *used : OPT_BYTES - 1),
                            *used < OPT_BYTES ? OPT_BYTES - *used : 1, fmt, ap);
    va_end(ap);
    *used += w > 0 ? (size_t)w : 0;
}

castle_status castle__program_source(castle_family f, const castle_tuning *tuning, int dclass, char **source,
                                     char **options)
{
    const castle_tuning view = castle__family_tuning(f, tuning), *t = &view;
    *source = *options = NULL;
    char *sizes = NULL, *common = NULL, *body = NULL;
    castle_status st = load_source("common.cl", &common);
    if (st == CASTLE_SUCCESS)
        st = load_source("local_memory.h", &sizes);
    if (st == CASTLE_SUCCESS)
        st = load_source(families[f].file, &body);
    static const char prelude[] = "/* libcastle */\n";
    if (st != CASTLE_SUCCESS) {
        free(sizes);
        free(common);
        return st;
    }
    /* the build options, at most OPT_BYTES - 1 characters (today's longest: 241) */
    /* The three files in order, each after a #line directive, so that a compiler's messages and a
       program's debug lines (tools/oclgrind-banks.sh) give the file and its own line numbers. */
#define SOURCE_FMT "%s#line 1 \"local_memory.h\"\n%s\n#line 1 \"common.cl\"\n%s\n#line 1 \"%s\"\n%s"
    const int len = snprintf(NULL, 0, SOURCE_FMT, prelude, sizes, common, families[f].file, body);
    const size_t n = len < 0 ? 0 : (size_t)len + 1;
    char *src = n ? malloc(n) : NULL;
    char *opt = malloc(OPT_BYTES);
    if (!src || !opt) {
        free(sizes);
        free(common);
        free(body);
        free(src);
        free(opt);
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "out of host memory assembling %s", families[f].file);
    }
    snprintf(src, n, SOURCE_FMT, prelude, sizes, common, families[f].file, body);
#undef SOURCE_FMT
    /* one -D option per kernel macro of castle.h's CASTLE_TUNING_PARAMS */
    size_t used = 0;
    opt_add(opt, &used, "-cl-std=CL1.2");
    for (size_t i = 0; i < castle__tuning_nparams; ++i) {
        const castle_tuning_param *p = &castle__tuning_params[i];
        if (p->macro)
            opt_add(opt, &used, " -D%s=%u", p->macro, castle__tuning_get(t, p));
    }
    /* NVIDIA's register cap, the family's regs (fregs for the forwards; castle__tuning_check allows
       it only on devices with cl_nv_compiler_options) */
    if (t->regs)
        opt_add(opt, &used, " -cl-nv-maxrregcount=%u", t->regs);
    /* then the constants the kernels share with the host (defined once, in C), the family's own
       option and CASTLE_BUILD_QUIET (program.h) */
    opt_add(opt, &used,
            " -DCASTLE_MAX_HEAD_DIM=%d -DCASTLE_HEAD_DIM_CLASS=%d -DCASTLE_DECODE_ROWS=%d -DCASTLE_DECODE_GROUP=%d%s"
            CASTLE_BUILD_QUIET,
            CASTLE_MAX_HEAD_DIM, dclass, CASTLE_DECODE_ROWS, CASTLE_DECODE_GROUP, families[f].option);
    free(sizes);
    free(common);
    free(body);
    if (used >= OPT_BYTES) { /* a longer list of tuning parameters than the buffer was sized for */
        free(src);
        free(opt);
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "the build options of %s need more than %d bytes",
                            families[f].file, (int)OPT_BYTES - 1);
    }
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

/* Tries the binary cache; returns a built program or NULL.  An entry the driver rejects is
   deleted, so that the caller's build from source replaces it. */
static cl_program from_cache(castle_context *ctx, const char *const *key, int nkey)
{
    unsigned char *bin = NULL;
    size_t len = 0;
    if (!castle__bincache_load(key, nkey, &bin, &len))
        return NULL;
    cl_int err = CL_SUCCESS, bstatus = CL_SUCCESS;
    const unsigned char *bins[1] = {bin};
    cl_program prog = clCreateProgramWithBinary(ctx->cl_ctx, 1, &ctx->device, &len, bins, &bstatus, &err);
    free(bin);
    if (prog && (err != CL_SUCCESS || bstatus != CL_SUCCESS ||
                 clBuildProgram(prog, 1, &ctx->device, key[1], NULL, NULL) != CL_SUCCESS)) {
        clReleaseProgram(prog);
        prog = NULL;
    }
    if (!prog)
        castle__bincache_discard(key, nkey);
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

/* The program of family f under tuning t: from the binary cache when use_cache (then *cached is
   set), else, or when that fails, built from source and stored in the cache.  Without use_cache the
   cache entry is deleted first: the caller found its binary unusable. */
static castle_status make_program(castle_context *ctx, castle_family f, const castle_tuning *t, int dclass,
                                  bool use_cache, cl_program *out, bool *cached)
{
    char *src, *opt;
    castle_status st = castle__program_source(f, t, dclass, &src, &opt);
    if (st != CASTLE_SUCCESS) {
        const char *why = castle_last_error(); /* e.g. CASTLE_CL_DIR names no readable file */
        set_log(ctx, why, strlen(why));
        return st;
    }
    const castle_device_info *in = &ctx->info;
    const char *key[] = {src, opt, in->name, in->vendor, in->driver_version, in->device_version, in->platform_version};
    const int nkey = (int)(sizeof key / sizeof key[0]);
    cl_program prog = NULL;
    if (use_cache)
        prog = from_cache(ctx, key, nkey);
    else
        castle__bincache_discard(key, nkey);
    *cached = prog != NULL;
    if (prog) {
        static const char loaded[] = "program binary loaded from the on-disk cache; nothing compiled\n";
        set_log(ctx, loaded, sizeof loaded - 1);
    } else {
        cl_int err = CL_SUCCESS;
        const char *srcs[1] = {src};
        prog = clCreateProgramWithSource(ctx->cl_ctx, 1, srcs, NULL, &err);
        if (!prog) {
            st = castle__cl_fail(err, "clCreateProgramWithSource");
        } else {
            err = clBuildProgram(prog, 1, &ctx->device, opt, NULL, NULL);
            keep_log(ctx, prog);
            if (err != CL_SUCCESS) {
                clReleaseProgram(prog);
                prog = NULL;
                if (err == CL_BUILD_PROGRAM_FAILURE || err == CL_INVALID_BUILD_OPTIONS) /* the compiler said no */
                    st = castle__fail(CASTLE_ERR_BUILD_FAILED, "building %s with '%s' failed (OpenCL %d); see "
                                      "castle_build_log()", families[f].file, opt, (int)err);
                else /* no compiler, no memory: no build log to read either */
                    st = castle__fail((castle_status)err, "clBuildProgram of %s failed (OpenCL %d)", families[f].file,
                                      (int)err);
            } else {
                to_cache(prog, key, nkey);
            }
        }
    }
    free(src);
    free(opt);
    *out = prog;
    return st;
}

_Static_assert(CASTLE_MAX_PROGRAMS == 48, "castle.h (castle_context_set_tuning) documents 48 programs a context");

/* Index of the program of family f under the current tuning for head dim d, building it on first
   use. */
static castle_status get_program(castle_context *ctx, castle_family f, size_t d, int *index)
{
    const int dclass = castle__head_dim_class(f, &ctx->tuning, d);
    for (int i = 0; i < ctx->num_programs; ++i) {
        const castle_program_slot *s = &ctx->programs[i];
        if (s->family == f && s->dclass == dclass && !memcmp(&s->tuning, &ctx->tuning, sizeof s->tuning)) {
            *index = i;
            return CASTLE_SUCCESS;
        }
    }
    if (ctx->num_programs == CASTLE_MAX_PROGRAMS)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "more than %d kernel programs on one context",
                            CASTLE_MAX_PROGRAMS);
    castle_program_slot *s = &ctx->programs[ctx->num_programs];
    castle_status st = make_program(ctx, f, &ctx->tuning, dclass, true, &s->program, &s->from_cache);
    if (st != CASTLE_SUCCESS)
        return st;
    s->family = f;
    s->tuning = ctx->tuning;
    s->dclass = dclass;
    *index = ctx->num_programs++;
    return CASTLE_SUCCESS;
}

/* The program in slot `prog` came from the binary cache and the driver cannot make a kernel from
   it (some drivers accept a binary and fail only here): rebuild it from source in place.  Kernels
   already made from the old program stay alive (a caller may hold one) but are no longer found. */
static castle_status rebuild_from_source(castle_context *ctx, int prog)
{
    castle_program_slot *s = &ctx->programs[prog];
    cl_program fresh = NULL;
    bool cached = false;
    castle_status st = make_program(ctx, s->family, &s->tuning, s->dclass, false, &fresh, &cached);
    if (st != CASTLE_SUCCESS)
        return st;
    for (int i = 0; i < ctx->num_kernels; ++i)
        if (ctx->kernels[i].program == prog)
            ctx->kernels[i].program = -1; /* released with the context */
    clReleaseProgram(s->program); /* its kernels hold their own references */
    s->program = fresh;
    s->from_cache = false;
    return CASTLE_SUCCESS;
}

static castle_status get_kernel(castle_context *ctx, castle_family f, size_t d, const char *name, bool optional,
                                cl_kernel *kernel)
{
    int prog = 0;
    castle_status st = get_program(ctx, f, d, &prog);
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
    if (!k && ctx->programs[prog].from_cache) {
        if ((st = rebuild_from_source(ctx, prog)) != CASTLE_SUCCESS)
            return st;
        k = clCreateKernel(ctx->programs[prog].program, name, &err);
    }
    if (!k && optional && err == CL_INVALID_KERNEL_NAME) {
        *kernel = NULL;
        return CASTLE_SUCCESS;
    }
    if (!k)
        return castle__cl_fail(err, "clCreateKernel");
    /* The compiled kernel's local memory against the device's: a tuning the host's formulas pass can
       still ask too much (the decode kernels' arrays are in no formula of cl/local_memory.h); said
       here, before any launch, instead of CL_OUT_OF_RESOURCES at the enqueue.  (Not the work-group
       size: rusticl reports CL_KERNEL_WORK_GROUP_SIZE 32 for kernels it runs 64-wide.) */
    cl_ulong lmem = 0;
    if (clGetKernelWorkGroupInfo(k, ctx->device, CL_KERNEL_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL) == CL_SUCCESS &&
        lmem > ctx->info.local_mem_size) {
        clReleaseKernel(k);
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "kernel %s needs %llu bytes of local memory under this tuning; the device has %llu: the "
                            "tuning does not fit this device (castle-tune searches for one that does)",
                            name, (unsigned long long)lmem, (unsigned long long)ctx->info.local_mem_size);
    }
    castle_kernel_slot *ks = &ctx->kernels[ctx->num_kernels++];
    ks->program = prog;
    ks->name = name;
    ks->kernel = k;
    *kernel = k;
    return CASTLE_SUCCESS;
}

castle_status castle__get_kernel(castle_context *ctx, castle_family f, size_t d, const char *name, cl_kernel *kernel)
{
    castle__ctx_lock(ctx);
    castle_status st = get_kernel(ctx, f, d, name, false, kernel);
    castle__ctx_unlock(ctx);
    return st;
}

castle_status castle__find_kernel(castle_context *ctx, castle_family f, size_t d, const char *name, cl_kernel *kernel)
{
    castle__ctx_lock(ctx);
    castle_status st = get_kernel(ctx, f, d, name, true, kernel);
    castle__ctx_unlock(ctx);
    return st;
}
