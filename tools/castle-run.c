/* castle-run: drive libcastle from NumPy .npy files.
 *
 *   castle-run forward --in DIR --out DIR [--window W] [--scale S] [--device P:D] [--repeat N]
 *   castle-run random --shape B,H,L,d --out DIR [--seed S]
 *
 * Exit status: 0 success, 1 library or device failure, 2 bad usage or a malformed/unsupported .npy. */
#define _POSIX_C_SOURCE 200809L
#include "castle/castle.h"
#include "npy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: castle-run forward --in DIR --out DIR [--window W] [--scale S] [--device P:D] [--repeat N]\n"
    "       castle-run random --shape B,H,L,d --out DIR [--seed S]\n"
    "\n"
    "forward   reads DIR/qu.npy ku.npy vu.npy qc.npy kc.npy vc.npy (float32, C order, shape (B, H, L, d),\n"
    "          all equal), runs castle_forward and writes OUT/o.npy (B, H, L, d) and OUT/lse.npy (B, H, L).\n"
    "random    writes the six inputs of shape (B, H, L, d), uniform in [-1, 1), to OUT (for trying the tool).\n"
    "\n"
    "options:\n"
    "  --in DIR       directory holding the input .npy files\n"
    "  --out DIR      directory for the outputs (created if missing; its parent must exist)\n"
    "  --window W     0 = CASTLE (default), W >= 1 = CASTLE-SWL with lookahead window W\n"
    "  --scale S      score scale; 0 (default) means 1/sqrt(d)\n"
    "  --device P:D   OpenCL platform:device, or a flat index N (default: $CASTLE_DEVICE, else 0:0)\n"
    "  --shape B,H,L,d  (random) the shape to generate\n"
    "  --seed S       (random) seed of the generator (default 1)\n"
    "  --repeat N     after the run, one warm-up and N timed runs; prints median_ms=<device time of the\n"
    "                 operation alone, from OpenCL profiling events>\n"
    "  -h, --help     this text\n"
    "\n"
    "exit status: 0 success, 1 library or device failure, 2 bad usage or malformed input\n";

static const char *const in_names[6] = {"qu", "ku", "vu", "qc", "kc", "vc"};

typedef struct options {
    const char *cmd, *in, *out, *device;
    size_t shape[4];
    unsigned long long seed;
    long window;
    double scale;
    long repeat;
} options;

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "castle-run: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run castle-run --help for usage)\n");
    return 2;
}

static int parse_long(const char *s, long *v)
{
    char *end;
    errno = 0;
    *v = strtol(s, &end, 10);
    return end != s && *end == '\0' && !errno;
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->repeat = -1;
    if (argc < 2)
        return usage_error("%s", "missing command");
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        fputs(usage, stdout);
        exit(0);
    }
    o->cmd = argv[1];
    o->seed = 1;
    const bool random = !strcmp(o->cmd, "random");
    if (strcmp(o->cmd, "forward") && !random)
        return usage_error("unknown command '%s' (supported: forward, random)", o->cmd);
    for (int i = 2; i < argc; ++i) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            exit(0);
        }
        static const char *const known[] = {"--in", "--out", "--device", "--window", "--repeat", "--scale", "--shape", "--seed"};
        bool is_known = false;
        for (size_t q = 0; q < sizeof known / sizeof known[0]; ++q)
            is_known = is_known || !strcmp(a, known[q]);
        if (!is_known)
            return usage_error("unknown option '%s'", a);
        if (i + 1 >= argc)
            return usage_error("option '%s' needs a value", a);
        const char *v = argv[++i];
        if (!strcmp(a, "--in"))
            o->in = v;
        else if (!strcmp(a, "--out"))
            o->out = v;
        else if (!strcmp(a, "--device"))
            o->device = v;
        else if (!strcmp(a, "--window")) {
            if (!parse_long(v, &o->window) || o->window < 0)
                return usage_error("--window needs an integer >= 0, got '%s'", v);
        } else if (!strcmp(a, "--repeat")) {
            if (!parse_long(v, &o->repeat) || o->repeat < 1 || o->repeat > 100000)
                return usage_error("--repeat needs an integer in 1..100000, got '%s'", v);
        } else if (!strcmp(a, "--scale")) {
            char *end;
            o->scale = strtod(v, &end);
            if (end == v || *end || !(o->scale >= 0))
                return usage_error("--scale needs a number >= 0, got '%s'", v);
        } else if (!strcmp(a, "--shape")) {
            int used = 0;
            if (sscanf(v, "%zu,%zu,%zu,%zu%n", &o->shape[0], &o->shape[1], &o->shape[2], &o->shape[3], &used) != 4 ||
                v[used] || !o->shape[0] || !o->shape[1] || !o->shape[2] || !o->shape[3] || v[0] == '-')
                return usage_error("--shape needs four positive integers B,H,L,d, got '%s'", v);
        } else if (!strcmp(a, "--seed")) {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (end == v || *end || errno || v[0] == '-')
                return usage_error("--seed needs a non-negative integer, got '%s'", v);
        }
    }
    if (random) {
        if (!o->shape[0])
            return usage_error("%s", "random needs --shape B,H,L,d");
        if (!o->out)
            return usage_error("%s", "--out DIR is required");
        return 0;
    }
    if (!o->in)
        return usage_error("%s", "--in DIR is required");
    if (!o->out)
        return usage_error("%s", "--out DIR is required");
    return 0;
}

/* Reads DIR/<name>.npy; checks it is 4-D and, if shape[0] is set, equal to shape. */
static int read_input(const char *dir, const char *name, size_t shape[4], npy_array *a)
{
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    if (npy_read_f32(path, a, err, sizeof err)) {
        fprintf(stderr, "castle-run: %s\n", err);
        return 2;
    }
    if (a->ndim != 4) {
        fprintf(stderr, "castle-run: %s: expected 4 dimensions (B, H, L, d), found %d\n", path, a->ndim);
        return 2;
    }
    if (shape[0] == 0) {
        memcpy(shape, a->shape, 4 * sizeof(size_t));
        if (!shape[0] || !shape[1] || !shape[2] || !shape[3]) {
            fprintf(stderr, "castle-run: %s: shape (%zu, %zu, %zu, %zu) has a zero dimension\n", path, shape[0],
                    shape[1], shape[2], shape[3]);
            return 2;
        }
    } else if (memcmp(shape, a->shape, 4 * sizeof(size_t))) {
        fprintf(stderr, "castle-run: %s: shape (%zu, %zu, %zu, %zu) disagrees with qu.npy (%zu, %zu, %zu, %zu)\n", path,
                a->shape[0], a->shape[1], a->shape[2], a->shape[3], shape[0], shape[1], shape[2], shape[3]);
        return 2;
    }
    return 0;
}

static int lib_error(castle_status st, const char *what)
{
    fprintf(stderr, "castle-run: %s failed: %s\n", what, castle_last_error()[0] ? castle_last_error() : castle_status_string(st));
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct fwd_job {
    castle_context *ctx;
    castle_attention_desc desc;
    cl_mem in[6], o, lse, ws;
} fwd_job;

static castle_status run_forward(fwd_job *j, cl_command_queue q, cl_uint nwait, const cl_event *wait, cl_event *ev)
{
    return castle_forward(j->ctx, &j->desc, j->in[0], j->in[1], j->in[2], j->in[3], j->in[4], j->in[5], j->o, j->lse,
                          j->ws, q, nwait, wait, ev);
}

/* One warm-up, then n timed runs; device time from a marker before each run to the end of its last
   launch.  Prints median_ms. */
static int time_forward(fwd_job *j, cl_command_queue q, long n)
{
    double *ms = malloc((size_t)n * sizeof(double));
    if (!ms)
        return lib_error(CASTLE_ERR_OUT_OF_HOST_MEMORY, "malloc");
    castle_status st = run_forward(j, q, 0, NULL, NULL);
    if (st)
        return free(ms), lib_error(st, "castle_forward");
    clFinish(q);
    for (long r = 0; r < n; ++r) {
        cl_event start = NULL, end = NULL;
        cl_int err = clEnqueueMarkerWithWaitList(q, 0, NULL, &start);
        if (err != CL_SUCCESS)
            return free(ms), lib_error((castle_status)err, "clEnqueueMarkerWithWaitList");
        st = run_forward(j, q, 1, &start, &end);
        if (st) {
            clReleaseEvent(start);
            return free(ms), lib_error(st, "castle_forward");
        }
        clWaitForEvents(1, &end);
        cl_ulong t0 = 0, t1 = 0;
        err = clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
        if (err == CL_SUCCESS)
            err = clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
        clReleaseEvent(start);
        clReleaseEvent(end);
        if (err != CL_SUCCESS)
            return free(ms), lib_error((castle_status)err, "clGetEventProfilingInfo");
        ms[r] = (double)(t1 - t0) * 1e-6;
    }
    qsort(ms, (size_t)n, sizeof(double), cmp_double);
    const double med = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
    printf("median_ms=%.3f\n", med);
    free(ms);
    return 0;
}

static int write_output(const char *dir, const char *name, const float *data, int ndim, const size_t *shape)
{
    char path[4096], err[512];
    mkdir(dir, 0777); /* an existing directory is fine; any real problem shows when the file is created */
    snprintf(path, sizeof path, "%s/%s.npy", dir, name);
    if (npy_write_f32(path, data, ndim, shape, err, sizeof err)) {
        fprintf(stderr, "castle-run: %s\n", err);
        return 2;
    }
    return 0;
}

static int cmd_forward(const options *opt)
{
    size_t shape[4] = {0, 0, 0, 0};
    npy_array arr[6];
    memset(arr, 0, sizeof arr);
    int rc = 0;
    for (int t = 0; t < 6 && !rc; ++t)
        rc = read_input(opt->in, in_names[t], shape, &arr[t]);
    fwd_job j;
    memset(&j, 0, sizeof j);
    float *o = NULL, *lse = NULL;
    if (rc)
        goto done;
    castle_status st = castle_context_create_default(opt->device, &j.ctx);
    if (st) {
        rc = lib_error(st, "opening the device");
        goto done;
    }
    cl_context clc = castle_context_cl_context(j.ctx);
    cl_command_queue q = castle_context_queue(j.ctx);
    castle_attention_desc_init(&j.desc, shape[0], shape[1], shape[2], shape[3]);
    j.desc.window = opt->window;
    j.desc.scale = (float)opt->scale;
    const size_t n = arr[0].count, nl = shape[0] * shape[1] * shape[2];
    size_t ws_bytes = 0;
    if ((st = castle_forward_workspace_size(j.ctx, &j.desc, &ws_bytes))) {
        rc = lib_error(st, "castle_forward_workspace_size");
        goto done;
    }
    cl_int err = CL_SUCCESS;
    for (int t = 0; t < 6 && err == CL_SUCCESS; ++t)
        j.in[t] = clCreateBuffer(clc, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, n * sizeof(float), arr[t].data, &err);
    if (err == CL_SUCCESS)
        j.o = clCreateBuffer(clc, CL_MEM_WRITE_ONLY, n * sizeof(float), NULL, &err);
    if (err == CL_SUCCESS)
        j.lse = clCreateBuffer(clc, CL_MEM_WRITE_ONLY, nl * sizeof(float), NULL, &err);
    if (err == CL_SUCCESS)
        j.ws = clCreateBuffer(clc, CL_MEM_READ_WRITE, ws_bytes, NULL, &err);
    if (err != CL_SUCCESS) {
        rc = lib_error((castle_status)err, "allocating device buffers");
        goto done;
    }
    if ((st = run_forward(&j, q, 0, NULL, NULL))) {
        rc = lib_error(st, "castle_forward");
        goto done;
    }
    o = malloc(n * sizeof(float));
    lse = malloc(nl * sizeof(float));
    if (!o || !lse) {
        rc = lib_error(CASTLE_ERR_OUT_OF_HOST_MEMORY, "malloc");
        goto done;
    }
    err = clEnqueueReadBuffer(q, j.o, CL_TRUE, 0, n * sizeof(float), o, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(q, j.lse, CL_TRUE, 0, nl * sizeof(float), lse, 0, NULL, NULL);
    if (err != CL_SUCCESS) {
        rc = lib_error((castle_status)err, "reading results");
        goto done;
    }
    if ((rc = write_output(opt->out, "o", o, 4, shape)) || (rc = write_output(opt->out, "lse", lse, 3, shape)))
        goto done;
    if (opt->repeat > 0)
        rc = time_forward(&j, q, opt->repeat);
done:
    for (int t = 0; t < 6; ++t) {
        if (j.in[t])
            clReleaseMemObject(j.in[t]);
        npy_free(&arr[t]);
    }
    if (j.o)
        clReleaseMemObject(j.o);
    if (j.lse)
        clReleaseMemObject(j.lse);
    if (j.ws)
        clReleaseMemObject(j.ws);
    castle_context_destroy(j.ctx);
    free(o);
    free(lse);
    return rc;
}

static unsigned long long mix64(unsigned long long z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmd_random(const options *opt)
{
    size_t n = 1;
    for (int i = 0; i < 4; ++i) {
        if (opt->shape[i] > ((size_t)1 << 40) / n) {
            fprintf(stderr, "castle-run: --shape is too large\n");
            return 2;
        }
        n *= opt->shape[i];
    }
    float *data = malloc(n * sizeof(float));
    if (!data)
        return lib_error(CASTLE_ERR_OUT_OF_HOST_MEMORY, "malloc");
    unsigned long long s = mix64(opt->seed ^ 0x6a09e667f3bcc909ull); /* neighbouring seeds: unrelated streams */
    int rc = 0;
    for (int t = 0; t < 6 && !rc; ++t) {
        for (size_t i = 0; i < n; ++i) /* splitmix64; 24 bits make an exact float in [-1, 1) */
            data[i] = (float)(mix64(s += 0x9e3779b97f4a7c15ull) >> 40) * 0x1p-23f - 1.0f;
        rc = write_output(opt->out, in_names[t], data, 4, opt->shape);
    }
    free(data);
    return rc;
}

int main(int argc, char **argv)
{
    options opt;
    int rc = parse_args(argc, argv, &opt);
    if (rc)
        return rc;
    return !strcmp(opt.cmd, "random") ? cmd_random(&opt) : cmd_forward(&opt);
}
