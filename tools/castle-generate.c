/* castle-generate: a generation loop with the UQ-KV cache (docs/algorithm.md section 5), one attention layer.
 *
 *   castle-generate [--prompt P] [--tokens N] [--heads H] [--dim d] [--window W] [--device P:D]
 *
 * Creates a cache, prefills a prompt of P tokens, then decodes N tokens one call each, as a serving
 * loop does.  In a model each new token's six projections come from the previous token's output
 * through the layer's weights; here they are fixed random values, so the loop shows the calls, their
 * order and their cost.  Prints the cache size and the median time per decoded token (tools/tool.h):
 * device time from profiling events (clock=device; clock=host where the device gives none), and the
 * wall clock from castle_decode until its output is ready, what the loop waits for (wall_ms).
 * Exit status: 0 success, 1 library or device failure, 2 bad usage. */
#define _POSIX_C_SOURCE 200809L
#include "castle/castle.h"
#include "tool.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int fail(castle_status st, const char *what) { return tool_fail("castle-generate", st, what); }

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

static const char usage[] =
    "usage: castle-generate [--prompt P] [--tokens N] [--heads H] [--dim d] [--window W] [--device P:D]\n"
    "\n"
    "An example generation loop with the UQ-KV cache, one attention layer, batch 1: creates a cache for\n"
    "P + N tokens, prefills a prompt of P tokens (castle_prefill), then decodes N tokens one\n"
    "castle_decode call each, waiting for each token's output as a serving loop does.  The six\n"
    "projections are fixed random values.\n"
    "\n"
    "options:\n"
    "  --prompt P     prompt tokens (default 128)\n"
    "  --tokens N     tokens decoded after the prompt (default 32)\n"
    "  --heads H      heads (default 8)\n"
    "  --dim d        head dim, 1..256 (default 64)\n"
    "  --window W     CASTLE-SWL window, 0 = CASTLE (default 0)\n"
    "  --device P:D   OpenCL platform:device or flat index (default: $CASTLE_DEVICE, else 0:0)\n"
    "  -h, --help     this text\n"
    "\n"
    "Prints: heads=H d=d window=W prompt=P decoded=N length=<cache length> cache_bytes=<bytes>, then\n"
    "decode per token: median_ms=<device time, or wall clock where the device gives none> clock=device|host\n"
    "wall_ms=<castle_decode until its output is ready>\n"
    "exit status: 0 success, 1 library or device failure, 2 bad usage\n";

/* One decode step: the token's six projections in, its output out. */
typedef struct step {
    castle_context *ctx;
    castle_cache *cache;
    castle_attention_desc desc;
    cl_mem *in, o;
    cl_command_queue q;
} step;

static castle_status decode_one(void *state, cl_event wait, cl_event *end)
{
    step *s = state;
    return castle_decode(s->ctx, s->cache, &s->desc, s->in[0], s->in[1], s->in[2], s->in[3], s->in[4], s->in[5], s->o,
                         NULL, s->q, wait ? 1 : 0, wait ? &wait : NULL, end);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"prompt", required_argument, NULL, 0}, {"tokens", required_argument, NULL, 1},
        {"heads", required_argument, NULL, 2},  {"dim", required_argument, NULL, 3},
        {"window", required_argument, NULL, 4}, {"device", required_argument, NULL, 5},
        {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0}};
    long val[] = {128, 32, 8, 64, 0}; /* defaults, in the order of longopts */
    const char *device = NULL;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        char *end = NULL;
        if (c == 'h')
            return fputs(usage, stdout), 0;
        if (c == 5)
            device = optarg;
        else if (c >= 0 && c < 5) {
            errno = 0;
            val[c] = strtol(optarg, &end, 10);
        }
        if (c == '?' || (end && (end == optarg || *end || errno))) /* errno: ERANGE, not the saturated value */
            return fprintf(stderr, "castle-generate: bad option or value '%s'\n%s", argv[optind - 1], usage), 2;
    }
    if (optind < argc)
        return fprintf(stderr, "castle-generate: unexpected argument '%s'\n%s", argv[optind], usage), 2;
    const long prompt = val[0], tokens = val[1], heads = val[2], dim = val[3], window = val[4];
    if (prompt < 1 || tokens < 1 || heads < 1 || dim < 1 || window < 0)
        return fprintf(stderr, "castle-generate: prompt, tokens, heads and dim must be >= 1, window >= 0\n"), 2;
    if (heads > INT_MAX) /* the library's limit on batch x heads (castle.h) */
        return fprintf(stderr, "castle-generate: heads must be at most %d, got %ld\n", INT_MAX, heads), 2;
    if (dim > CASTLE_MAX_HEAD_DIM)
        return fprintf(stderr, "castle-generate: dim must be at most %d, got %ld\n", CASTLE_MAX_HEAD_DIM, dim), 2;
    /* the buffers' sizes (heads x (prompt + tokens) x dim floats) must not overflow */
    if (prompt > (long)(SIZE_MAX / 8) - tokens ||
        (size_t)heads > SIZE_MAX / sizeof(float) / (size_t)dim / (size_t)(prompt + tokens))
        return fprintf(stderr, "castle-generate: heads x (prompt + tokens) x dim floats do not fit in memory\n"), 2;
    const size_t B = 1, H = (size_t)heads, d = (size_t)dim, P = (size_t)prompt, N = (size_t)tokens;

    castle_context *ctx = NULL;
    int rc = tool_open_device("castle-generate", device, &ctx);
    if (rc)
        return rc;
    cl_context cl = castle_context_cl_context(ctx);
    cl_command_queue q = castle_context_queue(ctx);

    /* 1. One cache per layer, sized for the whole generation. */
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, B, H, P + N, d);
    desc.window = window;
    castle_cache *cache = NULL;
    castle_status st = castle_cache_create(ctx, &desc, &cache);
    if (st)
        return fail(st, "castle_cache_create"), tool_close_device(ctx), 1;

    /* 2. Prefill: the prompt's six projections in, its outputs out, the cache filled. */
    cl_mem in[6], o = clCreateBuffer(cl, CL_MEM_READ_WRITE, B * H * P * d * sizeof(float), NULL, NULL);
    bool made = o != NULL;
    for (int t = 0; t < 6; ++t)
        made &= (in[t] = random_buffer(cl, B * H * P * d, 17u * (unsigned)t + 1u)) != NULL;
    if (!made) {
        fprintf(stderr, "castle-generate: cannot allocate the prompt's buffers (%zu floats each)\n", B * H * P * d);
        rc = 1;
        goto done;
    }
    desc.seq_len = P;
    st = castle_prefill(ctx, cache, &desc, NULL, in[0], in[1], in[2], in[3], in[4], in[5], o, NULL, q, 0, NULL, NULL);
    clFinish(q);
    const char *what = st ? "castle_prefill" : "castle_decode";

    /* 3. Decode: one token per call; the next token needs this one's output, so the timer waits for
       each (clFinish).  The first row of each prompt buffer stands in for the new token. */
    step s = {ctx, cache, desc, in, o, q};
    s.desc.seq_len = 1;
    tool_timing t;
    if (st == CASTLE_SUCCESS)
        st = tool_time(q, decode_one, &s, 0, (long)N, &t);
    size_t bytes = 0, length = 0;
    castle_cache_bytes(cache, &bytes);
    castle_cache_lengths(cache, &length);
    if (st != CASTLE_SUCCESS) {
        rc = fail(st, what);
    } else {
        printf("heads=%zu d=%zu window=%ld prompt=%zu decoded=%zu length=%zu cache_bytes=%zu\n", H, d, window, P, N,
               length, bytes);
        printf("decode per token: median_ms=%.3f clock=%s wall_ms=%.3f\n", t.ms, t.clock, t.wall_ms);
    }
done:
    for (int t = 0; t < 6; ++t)
        if (in[t])
            clReleaseMemObject(in[t]);
    if (o)
        clReleaseMemObject(o);
    castle_cache_destroy(cache);
    tool_close_device(ctx);
    return rc;
}
