/* castle-bench: device-time benchmark of libcastle's operations on one OpenCL device.
 *
 * One warm-up, then the median of --repeat runs (under --interleave, the forward, backward and prefill
 * rows of one L take their runs in turn: bench_interleaved); each run is timed from a marker enqueued before it
 * to the end of its last launch (OpenCL profiling events), so host work and other processes' CPU
 * time do not count, but launch gaps on the device do; where the device gives no profiling times,
 * host wall-clock to clFinish instead (tools/tool.h), and clock= says which.  One line per measurement:
 *   op=forward impl=castle B=1 H=8 L=2048 d=64 W=0 median_ms=... gflops=... clock=device
 * Nominal FLOPs per batch entry and head (docs/algorithm.md section 6): causal forward 2 d L^2, CASTLE forward
 * 5 d L^2 (CASTLE-SWL is charged the same, so its GFLOP/s reads as CASTLE-equivalent work per second),
 * backward 2.5x the forward, prefill as the forward; decode of the token at position t: 4 d t
 * (causal) and 10 d t (CASTLE), per token.  op=gemm impl=clblast: CLBlast SGEMM n x n x n, 2 n^3.
 * Decode lines also give gbs=, the bytes a decode must move over its time (GB/s; model_bytes): the
 * measure to hold against the device's memory bandwidth, since decode reads the whole cache. */
#define _POSIX_C_SOURCE 200809L
#include "castle/castle.h"
#include "tool.h"

#include <clblast_c.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: castle-bench [options]\n"
    "\n"
    "Times forward, backward, prefill and decode for CASTLE, CASTLE-SWL and standard causal attention\n"
    "on one OpenCL device, and CLBlast SGEMM as the device's practical matrix rate.\n"
    "\n"
    "options:\n"
    "  --device P:D       OpenCL platform:device or flat index (default: $CASTLE_DEVICE, else 0:0)\n"
    "  --ops LIST         comma list of forward,backward,prefill,decode (default: all)\n"
    "  --impls LIST       comma list of castle,swl,causal (default: all)\n"
    "  --L LIST           sequence lengths (default: 512,1024,2048,4096,8192)\n"
    "  --t LIST           decode positions (cache lengths) for op=decode (default: the --L list)\n"
    "  --d N              head dim, 1..256 (default 64)\n"
    "  --batch N          batch entries (default 1)\n"
    "  --heads N          heads (default 8)\n"
    "  --window W         CASTLE-SWL window (default 512)\n"
    "  --repeat N         timed runs per measurement, median reported (default 5)\n"
    "  --gemm N           CLBlast SGEMM size (default 1024; 0 skips it)\n"
    "  --ragged           op=prefill of castle and swl with prompts of different lengths (L-1-b tokens for\n"
    "                     batch entry b, at least 1): the library's path for ragged prompts, which computes\n"
    "                     the cache's lookahead keys by a gated pass instead of taking the forward's;\n"
    "                     reported as op=prefill_ragged\n"
    "  --profile          after each measurement, one more run with every kernel launch timed (the\n"
    "                     library's launch observer): a line per kernel, in order of first launch,\n"
    "                     with its launches, work-groups, summed device time, longest launch and share\n"
    "                     of the run's span (first launch's start to last launch's end), then\n"
    "                     kernel=(gaps): the part of the span in which no kernel ran (launch gaps,\n"
    "                     copies); under --json, objects with a \"kernel\" key, each launch's\n"
    "                     work-groups and time in launch order (launch_groups, launch_ms)\n"
    "  --interleave       time forward, backward and prefill round robin: at each L, after one untimed\n"
    "                     run of each, --repeat rounds of one timed run of every selected operation and\n"
    "                     implementation, so that their medians (and ratios of them) come from the same\n"
    "                     stretch of time on a shared or drifting machine; lines come L by L (decode\n"
    "                     lines after them, measured as without it)\n"
    "  --json             print the measurements as one JSON array instead of lines\n"
    "  -h, --help         this text\n"
    "\n"
    "Lines look like: op=forward impl=castle B=1 H=8 L=2048 d=64 W=0 median_ms=12.345 gflops=67.8 clock=device\n"
    "(op=decode lines add gbs=<GB/s>: the bytes a decode must read and write, over its time; per batch entry\n"
    "and head at cache length t, 4 x 2 t d for causal (K, V read) and 4 x 5 t d for CASTLE (U read and\n"
    "written, qU, kC, vC read; CASTLE-SWL: U written and qU read only for the last W rows))\n"
    "(clock=device: OpenCL profiling times; clock=host: wall clock to clFinish, where the device gives none)\n"
    "Lines that start with # are comments (a decode's cache size: # cache_bytes=N (capacity T tokens)).\n"
    "--profile lines look like: profile op=forward impl=castle B=1 H=8 L=2048 d=64 W=0\n"
    "kernel=castle_forward_block launches=32 groups=4224 ms=11.2 max_ms=0.9 share=0.95 (without the\n"
    "times where the device gives none)\n"
    "exit status: 0 success, 1 library or device failure, 2 bad usage\n";

enum { OP_FORWARD, OP_BACKWARD, OP_PREFILL, OP_DECODE, NOPS };
enum { IMPL_CASTLE, IMPL_SWL, IMPL_CAUSAL, NIMPLS };
static const char *const op_names[NOPS] = {"forward", "backward", "prefill", "decode"};
static const char *const impl_names[NIMPLS] = {"castle", "swl", "causal"};

typedef struct options {
    const char *device;
    bool ops[NOPS], impls[NIMPLS];
    size_t L[32], t[32];
    int nL, nt;
    size_t d, batch, heads, gemm;
    long window, repeat;
    bool json, ragged, profile, interleave;
} options;

static int fail_usage(const char *msg, const char *arg)
{
    fprintf(stderr, "castle-bench: %s '%s'\n(run castle-bench --help for usage)\n", msg, arg);
    return 2;
}

_Static_assert(CASTLE_MAX_HEAD_DIM == 256, "castle-bench's --d message and --help name 256");

static bool parse_size(const char *s, size_t *v)
{
    unsigned long long x;
    if (!tool_parse_whole(s, SIZE_MAX, &x))
        return false;
    *v = (size_t)x;
    return true;
}

static bool parse_list(const char *s, size_t *out, int *n)
{
    char buf[512];
    if (strlen(s) >= sizeof buf || !tool_list_whole(s))
        return false;
    strcpy(buf, s);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == 32 || !parse_size(tok, &out[*n]) || out[*n] == 0)
            return false;
        ++*n;
    }
    return *n > 0;
}

static int parse_args(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    for (int k = 0; k < NOPS; ++k)
        o->ops[k] = true;
    for (int k = 0; k < NIMPLS; ++k)
        o->impls[k] = true;
    static const size_t defL[] = {512, 1024, 2048, 4096, 8192};
    o->nL = 5;
    memcpy(o->L, defL, sizeof defL);
    o->d = 64;
    o->batch = 1;
    o->heads = 8;
    o->gemm = 1024;
    o->window = 512;
    o->repeat = 5;
    enum { O_DEVICE = 256, O_OPS, O_IMPLS, O_L, O_T, O_D, O_BATCH, O_HEADS, O_WINDOW, O_REPEAT, O_GEMM, O_JSON, O_RAGGED, O_PROFILE, O_INTERLEAVE };
    static const struct option longopts[] = {
        {"device", required_argument, NULL, O_DEVICE}, {"ops", required_argument, NULL, O_OPS},
        {"impls", required_argument, NULL, O_IMPLS},   {"L", required_argument, NULL, O_L},
        {"t", required_argument, NULL, O_T},           {"d", required_argument, NULL, O_D},
        {"batch", required_argument, NULL, O_BATCH},   {"heads", required_argument, NULL, O_HEADS},
        {"window", required_argument, NULL, O_WINDOW}, {"repeat", required_argument, NULL, O_REPEAT},
        {"gemm", required_argument, NULL, O_GEMM},     {"json", no_argument, NULL, O_JSON},
        {"ragged", no_argument, NULL, O_RAGGED},       {"profile", no_argument, NULL, O_PROFILE},
        {"interleave", no_argument, NULL, O_INTERLEAVE}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        const char *v = optarg;
        size_t x = 0;
        long unused;
        switch (c) {
        case 'h':
            fputs(usage, stdout);
            exit(0);
        case O_JSON:
            o->json = true;
            break;
        case O_RAGGED:
            o->ragged = true;
            break;
        case O_PROFILE:
            o->profile = true;
            break;
        case O_INTERLEAVE:
            o->interleave = true;
            break;
        case O_DEVICE:
            if (castle_parse_device_spec(v, &unused, &unused) != CASTLE_SUCCESS)
                return fail_usage("--device takes P:D or a flat index N; got", v);
            o->device = v;
            break;
        case O_OPS:
            if (!tool_parse_names(v, op_names, NOPS, o->ops, NULL, 0))
                return fail_usage("--ops takes forward,backward,prefill,decode; got", v);
            break;
        case O_IMPLS:
            if (!tool_parse_names(v, impl_names, NIMPLS, o->impls, NULL, 0))
                return fail_usage("--impls takes castle,swl,causal; got", v);
            break;
        case O_L:
            if (!parse_list(v, o->L, &o->nL))
                return fail_usage("--L takes a comma list of positive integers; got", v);
            break;
        case O_T:
            if (!parse_list(v, o->t, &o->nt))
                return fail_usage("--t takes a comma list of positive integers; got", v);
            break;
        case ':':
            return fail_usage("missing value for", argv[optind - 1]);
        case '?':
            return fail_usage("unknown option", argv[optind - 1]);
        default: /* the options with one non-negative integer */
            if (!parse_size(v, &x))
                return fail_usage("expected a non-negative integer, got", v);
            if (c == O_D && (x < 1 || x > CASTLE_MAX_HEAD_DIM))
                return fail_usage("--d must be in 1..256 (CASTLE_MAX_HEAD_DIM), got", v);
            else if (c == O_D)
                o->d = x;
            else if (c == O_BATCH)
                o->batch = x;
            else if (c == O_HEADS)
                o->heads = x;
            else if (c == O_GEMM)
                o->gemm = x;
            else if (c == O_WINDOW && (x < 1 || x > LONG_MAX))
                return fail_usage("--window must be >= 1 (it is the CASTLE-SWL window) and fit a long, got", v);
            else if (c == O_WINDOW)
                o->window = (long)x;
            else if (x < 1 || x > 1000)
                return fail_usage("--repeat must be in 1..1000, got", v);
            else
                o->repeat = (long)x;
        }
    }
    if (optind < argc)
        return fail_usage("unexpected argument", argv[optind]);
    if (!o->batch || !o->heads) /* --d's range is checked with its value */
        return fail_usage("--batch and --heads must be >= 1, got", o->batch ? "--heads 0" : "--batch 0");
    if (!o->nt) {
        o->nt = o->nL;
        memcpy(o->t, o->L, sizeof o->t);
    }
    return 0;
}

/* ---- measurement ---------------------------------------------------------------------------- */

typedef struct bench {
    castle_context *ctx;
    cl_context clc;
    cl_command_queue q;
    const options *opt;
    int printed;
} bench;

/* One run of an operation: enqueue after `wait` (one event), return the end event. */
typedef tool_run_fn run_fn;

/* One warm-up, then the median of --repeat timed runs (tools/tool.h). */
static castle_status measure(bench *bn, run_fn fn, void *state, tool_timing *t)
{
    return tool_time(bn->q, fn, state, 1, bn->opt->repeat, t);
}

/* One measurement; bytes > 0 (decode) adds its GB/s. */
static void report(bench *bn, const char *op, const char *impl, size_t L, long W, const tool_timing *t,
                   double flops, double bytes)
{
    const options *o = bn->opt;
    const double ms = t->ms, gflops = flops / (ms * 1e-3) * 1e-9, gbs = bytes / (ms * 1e-3) * 1e-9;
    char extra[64] = "";
    if (o->json) {
        if (bytes > 0)
            snprintf(extra, sizeof extra, ", \"gbs\": %.3f", gbs);
        printf("%s\n  {\"op\": \"%s\", \"impl\": \"%s\", \"B\": %zu, \"H\": %zu, \"%s\": %zu, \"d\": %zu, \"W\": %ld, "
               "\"median_ms\": %.4f, \"gflops\": %.3f%s, \"clock\": \"%s\"}",
               bn->printed ? "," : "[", op, impl, o->batch, o->heads, strcmp(op, "decode") ? "L" : "t", L, o->d, W,
               ms, gflops, extra, t->clock);
    } else {
        if (bytes > 0)
            snprintf(extra, sizeof extra, " gbs=%.3f", gbs);
        printf("op=%s impl=%s B=%zu H=%zu %s=%zu d=%zu W=%ld median_ms=%.4f gflops=%.3f%s clock=%s\n", op, impl,
               o->batch, o->heads, strcmp(op, "decode") ? "L" : "t", L, o->d, W, ms, gflops, extra, t->clock);
    }
    fflush(stdout);
    ++bn->printed;
}

static void report_gemm(bench *bn, size_t n, const tool_timing *t)
{
    const double ms = t->ms, gflops = 2.0 * (double)n * (double)n * (double)n / (ms * 1e-3) * 1e-9;
    if (bn->opt->json)
        printf("%s\n  {\"op\": \"gemm\", \"impl\": \"clblast\", \"n\": %zu, \"median_ms\": %.4f, \"gflops\": %.3f, "
               "\"clock\": \"%s\"}",
               bn->printed ? "," : "[", n, ms, gflops, t->clock);
    else
        printf("op=gemm impl=clblast n=%zu median_ms=%.4f gflops=%.3f clock=%s\n", n, ms, gflops, t->clock);
    fflush(stdout);
    ++bn->printed;
}

/* ---- --profile: one more run, every launch timed ---------------------------------------------- */

typedef struct launch_rec {
    const char *kernel; /* the library's static name */
    cl_event ev;
    size_t groups;
} launch_rec;
typedef struct profile {
    launch_rec *v;
    size_t n, cap;
    bool lost; /* a launch could not be recorded (out of memory) */
} profile;

/* The launch observer (castle_context_set_launch_observer): keeps every launch's event. */
static void observe(void *user, const char *kernel, cl_event ev, size_t groups, size_t group_size)
{
    profile *p = user;
    (void)group_size;
    if (p->n == p->cap) {
        const size_t cap = p->cap ? 2 * p->cap : 256;
        launch_rec *v = realloc(p->v, cap * sizeof *v);
        if (!v) {
            p->lost = true;
            return;
        }
        p->v = v;
        p->cap = cap;
    }
    if (clRetainEvent(ev) != CL_SUCCESS) {
        p->lost = true;
        return;
    }
    p->v[p->n++] = (launch_rec){kernel, ev, groups};
}

static int cmp_interval(const void *a, const void *b)
{
    const cl_ulong *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* One profile line (kernel NULL: the gaps); under --json, with each launch's work-groups and time
   (iv: the launches' start and end, when span > 0). */
static void print_profile(bench *bn, const char *op, const char *impl, size_t L, long W, const char *kernel,
                          size_t launches, size_t groups, double ms, double max_ms, double span, const profile *p,
                          const cl_ulong (*iv)[2])
{
    const options *o = bn->opt;
    const char *dim = strcmp(op, "decode") ? "L" : "t", *name = kernel ? kernel : "(gaps)";
    if (o->json) {
        printf("%s\n  {\"op\": \"%s\", \"impl\": \"%s\", \"B\": %zu, \"H\": %zu, \"%s\": %zu, \"d\": %zu, "
               "\"W\": %ld, \"kernel\": \"%s\", \"launches\": %zu, \"groups\": %zu",
               bn->printed ? "," : "[", op, impl, o->batch, o->heads, dim, L, o->d, W, name, launches, groups);
        if (span > 0)
            printf(", \"ms\": %.4f, \"max_ms\": %.4f, \"share\": %.4f", ms, max_ms, ms / span);
        if (kernel) { /* per launch, in launch order */
            for (int pass = 0; pass < (span > 0 ? 2 : 1); ++pass) {
                printf(pass ? ", \"launch_ms\": [" : ", \"launch_groups\": [");
                const char *sep = "";
                for (size_t k = 0; k < p->n; ++k) {
                    if (strcmp(p->v[k].kernel, kernel))
                        continue;
                    if (pass)
                        printf("%s%.4f", sep, (double)(iv[k][1] - iv[k][0]) * 1e-6);
                    else
                        printf("%s%zu", sep, p->v[k].groups);
                    sep = ", ";
                }
                printf("]");
            }
        }
        printf("}");
    } else {
        printf("profile op=%s impl=%s B=%zu H=%zu %s=%zu d=%zu W=%ld kernel=%s launches=%zu groups=%zu", op, impl,
               o->batch, o->heads, dim, L, o->d, W, name, launches, groups);
        if (span > 0)
            printf(" ms=%.4f max_ms=%.4f share=%.4f", ms, max_ms, ms / span);
        printf("\n");
    }
    fflush(stdout);
    ++bn->printed;
}

/* Runs fn once more with the launch observer on and prints where the run's device time went. */
static castle_status profile_run(bench *bn, run_fn fn, void *state, const char *op, const char *impl, size_t L,
                                 long W)
{
    profile p = {0};
    castle_status st = castle_context_set_launch_observer(bn->ctx, observe, &p);
    cl_event end = NULL;
    if (!st)
        st = fn(state, NULL, &end);
    castle_context_set_launch_observer(bn->ctx, NULL, NULL);
    if (!st)
        st = (castle_status)clFinish(bn->q);
    if (end)
        clReleaseEvent(end);
    cl_ulong(*iv)[2] = p.n ? malloc(p.n * sizeof *iv) : NULL;
    if (!st && (p.lost || (p.n && !iv)))
        st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
    bool timed = !st;
    for (size_t i = 0; i < p.n && timed; ++i)
        timed = tool_device_clock(p.v[i].ev, p.v[i].ev, &iv[i][0], &iv[i][1]) && iv[i][1] >= iv[i][0];
    double span = 0.0, busy = 0.0;
    if (timed && p.n) { /* the span, and the union of the launches' intervals within it */
        cl_ulong(*sorted)[2] = malloc(p.n * sizeof *sorted);
        if (!sorted) {
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        } else {
            memcpy(sorted, iv, p.n * sizeof *sorted);
            qsort(sorted, p.n, sizeof *sorted, cmp_interval);
            cl_ulong lo = sorted[0][0], hi = sorted[0][1], last = sorted[0][1];
            for (size_t i = 1; i < p.n; ++i) {
                if (sorted[i][0] > hi) {
                    busy += (double)(hi - lo) * 1e-6;
                    lo = sorted[i][0];
                    hi = sorted[i][1];
                } else if (sorted[i][1] > hi) {
                    hi = sorted[i][1];
                }
                if (sorted[i][1] > last)
                    last = sorted[i][1];
            }
            busy += (double)(hi - lo) * 1e-6;
            span = (double)(last - sorted[0][0]) * 1e-6;
            free(sorted);
        }
    }
    if (span <= 0.0)
        timed = false;
    for (size_t i = 0; i < p.n && !st; ++i) { /* one line per kernel, in order of first launch */
        bool seen = false;
        for (size_t k = 0; k < i && !seen; ++k)
            seen = !strcmp(p.v[k].kernel, p.v[i].kernel);
        if (seen)
            continue;
        size_t launches = 0, groups = 0;
        double ms = 0.0, max_ms = 0.0;
        for (size_t k = i; k < p.n; ++k) {
            if (strcmp(p.v[k].kernel, p.v[i].kernel))
                continue;
            ++launches;
            groups += p.v[k].groups;
            if (timed) {
                const double t = (double)(iv[k][1] - iv[k][0]) * 1e-6;
                ms += t;
                max_ms = t > max_ms ? t : max_ms;
            }
        }
        print_profile(bn, op, impl, L, W, p.v[i].kernel, launches, groups, ms, max_ms, timed ? span : 0.0, &p,
                      (const cl_ulong(*)[2])iv);
    }
    if (!st)
        print_profile(bn, op, impl, L, W, NULL, 0, 0, span - busy, 0.0, timed ? span : 0.0, &p,
                      (const cl_ulong(*)[2])iv);
    for (size_t i = 0; i < p.n; ++i)
        clReleaseEvent(p.v[i].ev);
    free(p.v);
    free(iv);
    return st;
}

/* ---- the problems --------------------------------------------------------------------------- */

typedef struct problem {
    bench *bn;
    castle_attention_desc desc;
    cl_mem buf[CASTLE_TENSOR_COUNT], ws;
    castle_cache *cache;
    castle_kv_cache *kv;
    size_t *lengths; /* --ragged: the prompt lengths of castle_prefill, else NULL */
    int impl;
} problem;

static void problem_release(problem *p)
{
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t)
        if (p->buf[t])
            clReleaseMemObject(p->buf[t]);
    if (p->ws)
        clReleaseMemObject(p->ws);
    castle_cache_destroy(p->cache);
    castle_kv_cache_destroy(p->kv);
    free(p->lengths);
    memset(p, 0, sizeof *p);
}

/* Device buffers for (B, H, L, d) with values in [-1, 1); returns a status. */
static castle_status problem_init(problem *p, bench *bn, int impl, size_t L)
{
    memset(p, 0, sizeof *p);
    p->bn = bn;
    p->impl = impl;
    const options *o = bn->opt;
    castle_attention_desc_init(&p->desc, o->batch, o->heads, L, o->d);
    p->desc.window = impl == IMPL_SWL ? o->window : 0;
    const size_t n = o->batch * o->heads * L * o->d;
    float *host = malloc(n * sizeof(float));
    if (!host)
        return CASTLE_ERR_OUT_OF_HOST_MEMORY;
    unsigned long long s = 0x2545f4914f6cdd1dull;
    for (size_t i = 0; i < n; ++i) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        host[i] = (float)(s >> 40) * 0x1p-23f - 1.0f;
    }
    cl_int err = CL_SUCCESS;
    for (int t = 0; t < CASTLE_TENSOR_COUNT && err == CL_SUCCESS; ++t) {
        const size_t count = t == CASTLE_TENSOR_LSE ? n / o->d : n;
        const bool input = t < CASTLE_TENSOR_O || t == CASTLE_TENSOR_DO;
        p->buf[t] = clCreateBuffer(bn->clc, CL_MEM_READ_WRITE | (input ? CL_MEM_COPY_HOST_PTR : 0),
                                   count * sizeof(float), input ? host : NULL, &err);
    }
    free(host);
    if (err != CL_SUCCESS)
        return (castle_status)err;
    if (impl == IMPL_CAUSAL)
        return CASTLE_SUCCESS; /* the causal baseline takes no workspace */
    size_t ws = 0;
    castle_status st = castle_forward_workspace_size(bn->ctx, &p->desc, &ws);
    if (st)
        return st;
    p->ws = clCreateBuffer(bn->clc, CL_MEM_READ_WRITE, ws, NULL, &err);
    return (castle_status)err;
}

#define WAIT1(w) ((w) ? 1u : 0u), ((w) ? &(w) : NULL)

static castle_status run_forward(void *state, cl_event wait, cl_event *end)
{
    problem *p = state;
    cl_mem *b = p->buf;
    if (p->impl == IMPL_CAUSAL)
        return castle_causal_forward(p->bn->ctx, &p->desc, b[3], b[4], b[5], b[6], b[7], p->bn->q, WAIT1(wait), end);
    return castle_forward(p->bn->ctx, &p->desc, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], p->ws, p->bn->q,
                          WAIT1(wait), end);
}

static castle_status run_backward(void *state, cl_event wait, cl_event *end)
{
    problem *p = state;
    cl_mem *b = p->buf;
    if (p->impl == IMPL_CAUSAL)
        return castle_causal_backward(p->bn->ctx, &p->desc, b[3], b[4], b[5], b[6], b[7], b[8], b[12], b[13], b[14],
                                      p->bn->q, WAIT1(wait), end);
    return castle_backward(p->bn->ctx, &p->desc, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], p->ws, b[8], b[9],
                           b[10], b[11], b[12], b[13], b[14], p->bn->q, WAIT1(wait), end);
}

static castle_status run_prefill(void *state, cl_event wait, cl_event *end)
{
    problem *p = state;
    cl_mem *b = p->buf;
    if (p->impl == IMPL_CAUSAL) {
        castle_status st = castle_kv_cache_reset(p->kv);
        return st ? st
                  : castle_causal_prefill(p->bn->ctx, p->kv, &p->desc, b[3], b[4], b[5], b[6], b[7], p->bn->q,
                                          WAIT1(wait), end);
    }
    castle_status st = castle_cache_reset(p->cache);
    if (st)
        return st;
    return castle_prefill(p->bn->ctx, p->cache, &p->desc, p->lengths, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
                          p->bn->q, WAIT1(wait), end);
}

/* decode: one token appended to a cache that holds t tokens (prefilled first); each timed run appends
   one more token, so the runs see t+1, t+2, ... (capacity t + repeat + 2). */
typedef struct decode_state {
    problem *p;     /* the one-token inputs and outputs */
    castle_attention_desc one;
    castle_kv_cache *kv; /* causal */
} decode_state;

static castle_status run_decode(void *state, cl_event wait, cl_event *end)
{
    decode_state *s = state;
    problem *p = s->p;
    cl_mem *b = p->buf;
    if (p->impl == IMPL_CAUSAL)
        return castle_causal_decode(p->bn->ctx, s->kv, &s->one, b[3], b[4], b[5], b[6], b[7], p->bn->q, WAIT1(wait),
                                    end);
    return castle_decode(p->bn->ctx, p->cache, &s->one, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], p->bn->q,
                         WAIT1(wait), end);
}

static int lib_error(castle_status st, const char *what) { return tool_fail("castle-bench", st, what); }

static double model_flops(int op, int impl, const options *o, size_t L)
{
    const double bh = (double)o->batch * (double)o->heads, d = (double)o->d, l = (double)L;
    const double fwd = (impl == IMPL_CAUSAL ? 2.0 : 5.0) * d * l * l * bh;
    switch (op) {
    case OP_BACKWARD:
        return 2.5 * fwd;
    case OP_DECODE:
        return (impl == IMPL_CAUSAL ? 4.0 : 10.0) * d * l * bh;
    default:
        return fwd;
    }
}

/* Bytes one decode at cache length t must move: the cache rows it reads and the U rows it rewrites
   (the new token's own rows are left out).  Causal: K and V, 2 t d floats per batch entry and head.
   CASTLE: U read and written, qU, kC, vC read, 5 t d; CASTLE-SWL reads U, kC, vC for all t rows but
   updates U and reads qU only for the last min(W, t). */
static double model_bytes(int impl, const options *o, size_t t, long W)
{
    const double bh = (double)o->batch * (double)o->heads, d = (double)o->d, tt = (double)t;
    const double win = (W > 0 && (size_t)W < t) ? (double)W : tt;
    const double floats = impl == IMPL_CAUSAL ? 2.0 * tt : 3.0 * tt + 2.0 * win;
    return 4.0 * floats * d * bh;
}

typedef struct gemm_state {
    bench *bn;
    size_t n;
    cl_mem m[3];
} gemm_state;

static castle_status run_gemm(void *state, cl_event wait, cl_event *end)
{
    gemm_state *g = state;
    const size_t n = g->n;
    (void)wait; /* CLBlast takes no wait list; the in-order queue runs it after the marker anyway */
    CLBlastStatusCode s = CLBlastSgemm(CLBlastLayoutRowMajor, CLBlastTransposeNo, CLBlastTransposeNo, n, n, n, 1.0f,
                                       g->m[0], 0, n, g->m[1], 0, n, 0.0f, g->m[2], 0, n, &g->bn->q, end);
    if (s != CLBlastSuccess) {
        fprintf(stderr, "castle-bench: CLBlastSgemm failed with status %d\n", (int)s);
        return CASTLE_ERR_INVALID_ARGUMENT;
    }
    return CASTLE_SUCCESS;
}

static int bench_gemm(bench *bn, size_t n)
{
    cl_int err = CL_SUCCESS;
    float *host = malloc(n * n * sizeof(float));
    if (!host)
        return lib_error(CASTLE_ERR_OUT_OF_HOST_MEMORY, "malloc");
    for (size_t i = 0; i < n * n; ++i)
        host[i] = (float)(i % 17) / 17.0f;
    gemm_state g = {bn, n, {NULL, NULL, NULL}};
    for (int k = 0; k < 3 && err == CL_SUCCESS; ++k)
        g.m[k] = clCreateBuffer(bn->clc, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * n * sizeof(float), host, &err);
    free(host);
    tool_timing t;
    castle_status st = err != CL_SUCCESS ? (castle_status)err : measure(bn, run_gemm, &g, &t); /* warm-up: CLBlast compiles */
    for (int k = 0; k < 3; ++k)
        if (g.m[k])
            clReleaseMemObject(g.m[k]);
    if (st)
        return lib_error(st, "gemm");
    report_gemm(bn, n, &t);
    return 0;
}

/* Device buffers for impl at L (problem_init), plus what the operations need before they can run: the
   forward's workspace filled (backward), a cache (prefill), the --ragged prompt lengths (prefill of
   castle and swl). */
static castle_status problem_setup(problem *p, bench *bn, int impl, size_t L, bool backward, bool prefill)
{
    castle_status st = problem_init(p, bn, impl, L);
    if (!st && backward)
        st = run_forward(p, NULL, NULL);
    if (!st && prefill)
        st = impl == IMPL_CAUSAL ? castle_kv_cache_create(bn->ctx, &p->desc, &p->kv)
                                 : castle_cache_create(bn->ctx, &p->desc, &p->cache);
    if (!st && prefill && impl != IMPL_CAUSAL && bn->opt->ragged) {
        if (!(p->lengths = malloc(bn->opt->batch * sizeof *p->lengths)))
            st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
        for (size_t b = 0; !st && b < bn->opt->batch; ++b)
            p->lengths[b] = b + 1 < L ? L - 1 - b : 1;
    }
    return st;
}

static run_fn training_fn(int op) { return op == OP_FORWARD ? run_forward : op == OP_BACKWARD ? run_backward : run_prefill; }

/* The op name a training measurement is reported under. */
static const char *training_name(const problem *p, int op)
{
    return op == OP_PREFILL && p->lengths ? "prefill_ragged" : op_names[op];
}

/* Reports one training measurement, then its --profile run. */
static castle_status training_report(bench *bn, problem *p, int op, size_t L, const tool_timing *ms)
{
    report(bn, training_name(p, op), impl_names[p->impl], L, p->desc.window, ms, model_flops(op, p->impl, bn->opt, L),
           0.0);
    return bn->opt->profile ? profile_run(bn, training_fn(op), p, training_name(p, op), impl_names[p->impl], L,
                                          p->desc.window)
                            : CASTLE_SUCCESS;
}

static int bench_training(bench *bn, int op, int impl, size_t L)
{
    problem p;
    tool_timing ms;
    castle_status st = problem_setup(&p, bn, impl, L, op == OP_BACKWARD, op == OP_PREFILL);
    if (!st)
        st = measure(bn, training_fn(op), &p, &ms);
    if (!st)
        st = training_report(bn, &p, op, L, &ms);
    problem_release(&p);
    return st ? lib_error(st, op_names[op]) : 0;
}

/* --interleave: every selected forward, backward and prefill at one L, round robin.  One problem per
   impl serves its operations (the backward reads the workspace its forward fills; the forward
   rewrites it with the same values).  Each operation runs once untimed, then --repeat rounds time
   one run of each in turn, so every operation's runs spread over the same stretch of time and a
   ratio of two medians is not a ratio of two different loads of a shared machine. */
static int bench_interleaved(bench *bn, size_t L)
{
    const options *o = bn->opt;
    const bool bw = o->ops[OP_BACKWARD], pf = o->ops[OP_PREFILL];
    problem p[NIMPLS];
    double *dev = calloc((size_t)(NOPS * NIMPLS * o->repeat), sizeof *dev);
    double *wall = calloc((size_t)(NOPS * NIMPLS * o->repeat), sizeof *wall);
    castle_status st = dev && wall ? CASTLE_SUCCESS : CASTLE_ERR_OUT_OF_HOST_MEMORY;
    int failed = OP_FORWARD; /* the operation a failure is reported under */
    memset(p, 0, sizeof p);
    for (int impl = 0; impl < NIMPLS && !st; ++impl)
        if (o->impls[impl])
            st = problem_setup(&p[impl], bn, impl, L, bw, pf);
    for (long r = -1; r < o->repeat && !st; ++r) /* r = -1: the untimed warm-up round */
        for (int op = 0; op < OP_DECODE && !st; ++op)
            for (int impl = 0; impl < NIMPLS && !st; ++impl) {
                if (!o->ops[op] || !o->impls[impl])
                    continue;
                failed = op;
                if (r < 0) {
                    st = tool_warm(bn->q, training_fn(op), &p[impl], 1);
                    continue;
                }
                const size_t at = (size_t)((op * NIMPLS + impl) * o->repeat + r);
                st = tool_time_one(bn->q, training_fn(op), &p[impl], &dev[at], &wall[at]);
            }
    for (int op = 0; op < OP_DECODE && !st; ++op)
        for (int impl = 0; impl < NIMPLS && !st; ++impl) {
            if (!o->ops[op] || !o->impls[impl])
                continue;
            const size_t at = (size_t)((op * NIMPLS + impl) * o->repeat);
            tool_timing ms;
            tool_timing_of(dev + at, wall + at, (size_t)o->repeat, &ms);
            failed = op;
            st = training_report(bn, &p[impl], op, L, &ms);
        }
    for (int impl = 0; impl < NIMPLS; ++impl)
        problem_release(&p[impl]);
    free(dev);
    free(wall);
    return st ? lib_error(st, op_names[failed]) : 0;
}

static int bench_decode(bench *bn, int impl, size_t t)
{
    /* the prompt: t tokens, prefilled once */
    problem prompt, one = {0}; /* released below even where its init never ran */
    castle_status st = problem_init(&prompt, bn, impl, t);
    if (!st)
        st = problem_init(&one, bn, impl, 1);
    decode_state s = {&one, one.desc, NULL};
    castle_attention_desc cd = prompt.desc;
    cd.seq_len = t + (size_t)bn->opt->repeat + 2; /* the prompt, the warm-up, the timed and --profile's tokens */
    cl_mem *b = prompt.buf;
    cl_event done = NULL;
    if (!st && impl == IMPL_CAUSAL) {
        st = castle_kv_cache_create(bn->ctx, &cd, &s.kv);
        if (!st)
            st = castle_causal_prefill(bn->ctx, s.kv, &prompt.desc, b[3], b[4], b[5], b[6], b[7], bn->q, 0, NULL,
                                       &done);
    } else if (!st) {
        st = castle_cache_create(bn->ctx, &cd, &one.cache);
        if (!st)
            st = castle_prefill(bn->ctx, one.cache, &prompt.desc, NULL, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
                                bn->q, 0, NULL, &done);
    }
    if (done) {
        clWaitForEvents(1, &done);
        clReleaseEvent(done);
    }
    tool_timing ms;
    if (!st)
        st = measure(bn, run_decode, &s, &ms);
    if (!st)
        report(bn, "decode", impl_names[impl], t, one.desc.window, &ms, model_flops(OP_DECODE, impl, bn->opt, t),
               model_bytes(impl, bn->opt, t, (long)one.desc.window));
    if (!st && bn->opt->profile)
        st = profile_run(bn, run_decode, &s, "decode", impl_names[impl], t, (long)one.desc.window);
    size_t bytes = 0;
    if (!st && !bn->opt->json &&
        (impl == IMPL_CAUSAL ? castle_kv_cache_bytes(s.kv, &bytes) : castle_cache_bytes(one.cache, &bytes)) ==
            CASTLE_SUCCESS)
        printf("# cache_bytes=%zu (capacity %zu tokens)\n", bytes, cd.seq_len);
    castle_kv_cache_destroy(s.kv);
    problem_release(&prompt);
    problem_release(&one);
    return st ? lib_error(st, "decode") : 0;
}

int main(int argc, char **argv)
{
    options opt;
    int rc = parse_args(argc, argv, &opt);
    if (rc)
        return rc;
    bench bn = {0};
    bn.opt = &opt;
    if ((rc = tool_open_device("castle-bench", opt.device, &bn.ctx)))
        return rc;
    bn.clc = castle_context_cl_context(bn.ctx);
    bn.q = castle_context_queue(bn.ctx);
    if (opt.gemm)
        rc = bench_gemm(&bn, opt.gemm);
    const bool training = opt.ops[OP_FORWARD] || opt.ops[OP_BACKWARD] || opt.ops[OP_PREFILL];
    for (int k = 0; opt.interleave && training && k < opt.nL && !rc; ++k)
        rc = bench_interleaved(&bn, opt.L[k]);
    for (int op = opt.interleave ? OP_DECODE : 0; op < NOPS && !rc; ++op) {
        if (!opt.ops[op])
            continue;
        for (int impl = 0; impl < NIMPLS && !rc; ++impl) {
            if (!opt.impls[impl])
                continue;
            const int n = op == OP_DECODE ? opt.nt : opt.nL;
            for (int k = 0; k < n && !rc; ++k)
                rc = op == OP_DECODE ? bench_decode(&bn, impl, opt.t[k]) : bench_training(&bn, op, impl, opt.L[k]);
        }
    }
    if (opt.json)
        printf("%s]\n", bn.printed ? "\n" : "[");
    tool_close_device(bn.ctx);
    return rc;
}
