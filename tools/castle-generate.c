/* castle-generate: a generation loop with the UQ-KV cache (SPEC section 5), one attention layer.
 *
 *   castle-generate [--prompt P] [--tokens N] [--heads H] [--dim d] [--window W] [--device P:D]
 *
 * Creates a cache, prefills a prompt of P tokens, then decodes N tokens one call each, as a serving
 * loop does.  In a model each new token's six projections come from the previous token's output
 * through the layer's weights; here they are fixed random values, so the loop shows the calls, their
 * order and their cost.  Prints the cache size and the median time per decoded token: wall clock from
 * castle_decode until its output is ready (what the loop waits for), and device time (profiling).
 * Exit status: 0 success, 1 library or device failure, 2 bad usage. */
#define _POSIX_C_SOURCE 200809L
#include "castle/castle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int fail(castle_status st, const char *what)
{
    fprintf(stderr, "castle-generate: %s: %s\n", what,
            castle_last_error()[0] ? castle_last_error() : castle_status_string(st));
    return 1;
}

static int cmp(const void *a, const void *b)
{
    return (*(const double *)a > *(const double *)b) - (*(const double *)a < *(const double *)b);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* A device buffer of n floats in [-1, 1). */
static cl_mem random_buffer(cl_context cl, size_t n, unsigned seed)
{
    float *x = malloc(n * sizeof(float));
    if (!x)
        return NULL;
    for (size_t i = 0; i < n; ++i)
        x[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-23f - 1.0f;
    cl_mem m = clCreateBuffer(cl, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n * sizeof(float), x, NULL);
    free(x);
    return m;
}

int main(int argc, char **argv)
{
    static const char *const keys[] = {"--prompt", "--tokens", "--heads", "--dim", "--window"};
    long val[] = {128, 32, 8, 64, 0}; /* defaults, in the order of keys */
    const char *device = NULL;
    for (int i = 1; i < argc; ++i) {
        int k = 0;
        while (k < 5 && strcmp(argv[i], keys[k]))
            ++k;
        if (i + 1 < argc && !strcmp(argv[i], "--device"))
            device = argv[++i];
        else if (k < 5 && i + 1 < argc)
            val[k] = strtol(argv[++i], NULL, 10);
        else
            return fprintf(stderr, "usage: castle-generate [--prompt P] [--tokens N] [--heads H] [--dim d] "
                                   "[--window W] [--device P:D]\n"),
                   2;
    }
    const long prompt = val[0], tokens = val[1], heads = val[2], dim = val[3], window = val[4];
    if (prompt < 1 || tokens < 1 || heads < 1 || dim < 1 || window < 0)
        return fprintf(stderr, "castle-generate: prompt, tokens, heads and dim must be >= 1, window >= 0\n"), 2;
    const size_t B = 1, H = (size_t)heads, d = (size_t)dim, P = (size_t)prompt, N = (size_t)tokens;

    castle_context *ctx = NULL;
    castle_status st = castle_context_create_default(device, &ctx);
    if (st)
        return fail(st, "opening the device");
    cl_context cl = castle_context_cl_context(ctx);
    cl_command_queue q = castle_context_queue(ctx);

    /* 1. One cache per layer, sized for the whole generation. */
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, B, H, P + N, d);
    desc.window = window;
    castle_cache *cache = NULL;
    if ((st = castle_cache_create(ctx, &desc, &cache)))
        return castle_context_destroy(ctx), fail(st, "castle_cache_create");

    /* 2. Prefill: the prompt's six projections in, its outputs out, the cache filled. */
    cl_mem in[6], o = clCreateBuffer(cl, CL_MEM_READ_WRITE, B * H * P * d * sizeof(float), NULL, NULL);
    for (int t = 0; t < 6; ++t)
        in[t] = random_buffer(cl, B * H * P * d, 17u * (unsigned)t + 1u);
    desc.seq_len = P;
    st = castle_prefill(ctx, cache, &desc, NULL, in[0], in[1], in[2], in[3], in[4], in[5], o, NULL, q, 0, NULL, NULL);
    clFinish(q);
    const char *what = st ? "castle_prefill" : "castle_decode";

    /* 3. Decode: one token per call; the next token needs this one's output, so wait for it. */
    double *wall = malloc(N * sizeof(double)), *dev = malloc(N * sizeof(double));
    desc.seq_len = 1; /* the first row of each prompt buffer stands in for the new token */
    for (size_t i = 0; st == CASTLE_SUCCESS && i < N && wall && dev; ++i) {
        cl_event start, done;
        const double t0 = now_ms();
        clEnqueueMarkerWithWaitList(q, 0, NULL, &start);
        st = castle_decode(ctx, cache, &desc, in[0], in[1], in[2], in[3], in[4], in[5], o, NULL, q, 1, &start, &done);
        if (st == CASTLE_SUCCESS) {
            clWaitForEvents(1, &done);
            wall[i] = now_ms() - t0;
            cl_ulong a = 0, b = 0;
            clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_START, sizeof a, &a, NULL);
            clGetEventProfilingInfo(done, CL_PROFILING_COMMAND_END, sizeof b, &b, NULL);
            dev[i] = (double)(b - a) * 1e-6;
            clReleaseEvent(done);
        }
        clReleaseEvent(start);
    }
    size_t bytes = 0, length = 0;
    castle_cache_bytes(cache, &bytes);
    castle_cache_lengths(cache, &length);
    int rc = 0;
    if (st != CASTLE_SUCCESS || !wall || !dev) {
        rc = fail(st ? st : CASTLE_ERR_OUT_OF_HOST_MEMORY, what);
    } else {
        qsort(wall, N, sizeof(double), cmp);
        qsort(dev, N, sizeof(double), cmp);
        printf("heads=%zu d=%zu window=%ld prompt=%zu decoded=%zu length=%zu cache_bytes=%zu\n", H, d, window, P, N,
               length, bytes);
        printf("decode per token: median wall_ms=%.3f device_ms=%.3f\n", wall[N / 2], dev[N / 2]);
    }
    free(wall);
    free(dev);
    for (int t = 0; t < 6; ++t)
        clReleaseMemObject(in[t]);
    clReleaseMemObject(o);
    castle_cache_destroy(cache);
    castle_context_destroy(ctx);
    return rc;
}
