/* castle-run: drive libcastle from NumPy .npy files.
 *
 *   castle-run forward --in DIR --out DIR [--window W] [--scale S] [--device P:D] [--repeat N]
 *   castle-run backward --in DIR --out DIR [--window W] [--scale S] [--device P:D] [--repeat N]
 *   castle-run random --shape B,H,L,d --out DIR [--seed S]
 *   castle-run decode --in DIR --out DIR --prompt P [--chunk C] [--window W] [--scale S] [--device P:D]
 *                     [--repeat N]
 *
 * Exit status: 0 success, 1 library or device failure, 2 bad usage or a malformed/unsupported .npy. */
#define _POSIX_C_SOURCE 200809L
#include "castle/castle.h"
#include "npy.h"
#include "tool.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
    "usage: castle-run forward --in DIR --out DIR [--window W] [--scale S] [--device P:D] [--repeat N]\n"
    "       castle-run backward --in DIR --out DIR [--window W] [--scale S] [--device P:D] [--repeat N]\n"
    "       castle-run random --shape B,H,L,d --out DIR [--seed S]\n"
    "       castle-run decode --in DIR --out DIR --prompt P [--chunk C] [--window W] [--scale S] [--device P:D]\n"
    "                         [--repeat N]\n"
    "\n"
    "forward   reads DIR/qu.npy ku.npy vu.npy qc.npy kc.npy vc.npy (float32, C order, shape (B, H, L, d),\n"
    "          all equal), runs castle_forward and writes OUT/o.npy (B, H, L, d) and OUT/lse.npy (B, H, L).\n"
    "backward  also reads DIR/do.npy (B, H, L, d), runs the forward then castle_backward and writes\n"
    "          OUT/dqu.npy dku.npy dvu.npy dqc.npy dkc.npy dvc.npy (B, H, L, d); --repeat times the backward.\n"
    "random    writes the six inputs and do.npy, shape (B, H, L, d), uniform in [-1, 1), to OUT.\n"
    "decode    reads the six inputs as forward does, prefills a UQ-KV cache (castle_prefill) with positions\n"
    "          0..P-1, decodes positions P..L-1 through it (castle_decode, C tokens per call) and writes\n"
    "          OUT/o.npy (B, H, L, d) with every output, prompt and generated; --repeat then times N more\n"
    "          one-token decodes at t = L and prints median_ms=<per token> and cache_bytes=<size>.\n"
    "\n"
    "options:\n"
    "  --in DIR       directory holding the input .npy files\n"
    "  --out DIR      directory for the outputs (created if missing; its parent must exist)\n"
    "  --window W     0 = CASTLE (default), W >= 1 = CASTLE-SWL with lookahead window W\n"
    "  --scale S      score scale, at most 65536; 0 (default) means 1/sqrt(d)\n"
    "  --device P:D   OpenCL platform:device, or a flat index N (default: $CASTLE_DEVICE, else 0:0)\n"
    "  --shape B,H,L,d  (random) the shape to generate\n"
    "  --seed S       (random) seed of the generator (default 1)\n"
    "  --prompt P     (decode) prompt length, 0..L (0: decode every position)\n"
    "  --chunk C      (decode) tokens per castle_decode call (default 1)\n"
    "  --repeat N     after the run, one warm-up and N timed runs; prints median_ms=<time of the operation\n"
    "                 alone> clock=device (OpenCL profiling events), or clock=host (wall clock to clFinish,\n"
    "                 where the device gives no profiling times)\n"
    "  -h, --help     this text\n"
    "An option applies to the commands whose usage line names it; another command refuses it (exit 2).\n"
    "\n"
    "exit status: 0 success, 1 library or device failure, 2 bad usage or malformed input\n";

/* Names of the tensors, in castle_tensor order (the inputs are DIR/<name>.npy). */
static const char *const tensor_names[CASTLE_TENSOR_COUNT] = {
    "qu", "ku", "vu", "qc", "kc", "vc", "o", "lse", "do", "dqu", "dku", "dvu", "dqc", "dkc", "dvc"};
#define in_names tensor_names

typedef struct options {
    const char *cmd, *in, *out, *device;
    size_t shape[4];
    unsigned long long seed;
    long window;
    double scale;
    long repeat;
    long prompt, chunk; /* decode */
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

enum { OPT_IN = 256, OPT_OUT, OPT_DEVICE, OPT_WINDOW, OPT_REPEAT, OPT_SCALE, OPT_SHAPE, OPT_SEED, OPT_PROMPT, OPT_CHUNK };

/* The commands each option applies to (the usage lines above): another command refuses it rather
   than ignore it.  Bits: forward, backward, random, decode. */
enum { CMD_F = 1, CMD_B = 2, CMD_R = 4, CMD_D = 8 };
static const unsigned applies[] = {
    [OPT_IN - OPT_IN] = CMD_F | CMD_B | CMD_D,     [OPT_OUT - OPT_IN] = CMD_F | CMD_B | CMD_R | CMD_D,
    [OPT_DEVICE - OPT_IN] = CMD_F | CMD_B | CMD_D, [OPT_WINDOW - OPT_IN] = CMD_F | CMD_B | CMD_D,
    [OPT_REPEAT - OPT_IN] = CMD_F | CMD_B | CMD_D, [OPT_SCALE - OPT_IN] = CMD_F | CMD_B | CMD_D,
    [OPT_SHAPE - OPT_IN] = CMD_R,                  [OPT_SEED - OPT_IN] = CMD_R,
    [OPT_PROMPT - OPT_IN] = CMD_D,                 [OPT_CHUNK - OPT_IN] = CMD_D};

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
    const bool random = !strcmp(o->cmd, "random"), decode = !strcmp(o->cmd, "decode");
    o->prompt = -1;
    o->chunk = 1;
    if (strcmp(o->cmd, "forward") && strcmp(o->cmd, "backward") && !random && !decode)
        return usage_error("unknown command '%s' (supported: forward, backward, random, decode)", o->cmd);
    static const struct option longopts[] = {
        {"in", required_argument, NULL, OPT_IN},         {"out", required_argument, NULL, OPT_OUT},
        {"device", required_argument, NULL, OPT_DEVICE}, {"window", required_argument, NULL, OPT_WINDOW},
        {"repeat", required_argument, NULL, OPT_REPEAT}, {"scale", required_argument, NULL, OPT_SCALE},
        {"shape", required_argument, NULL, OPT_SHAPE},   {"seed", required_argument, NULL, OPT_SEED},
        {"prompt", required_argument, NULL, OPT_PROMPT}, {"chunk", required_argument, NULL, OPT_CHUNK},
        {"help", no_argument, NULL, 'h'},                {NULL, 0, NULL, 0}};
    opterr = 0;
    optind = 2;
    const unsigned cmd = !strcmp(o->cmd, "forward") ? CMD_F : !strcmp(o->cmd, "backward") ? CMD_B : random ? CMD_R : CMD_D;
    int c, li = -1;
    while ((c = getopt_long(argc, argv, ":h", longopts, &li)) != -1) {
        const char *v = optarg;
        long lim;
        if (c >= OPT_IN && c <= OPT_CHUNK && !(applies[c - OPT_IN] & cmd)) {
            fprintf(stderr, "castle-run: option '--%s' does not apply to %s\n(run castle-run --help for usage)\n",
                    longopts[li].name, o->cmd);
            return 2;
        }
        switch (c) {
        case 'h':
            fputs(usage, stdout);
            exit(0);
        case OPT_IN:
            o->in = v;
            break;
        case OPT_OUT:
            o->out = v;
            break;
        case OPT_DEVICE:
            if (castle_parse_device_spec(v, &lim, &lim) != CASTLE_SUCCESS)
                return usage_error("--device needs P:D (platform:device) or a flat index N, got '%s'", v);
            o->device = v;
            break;
        case OPT_WINDOW:
            if (!parse_long(v, &o->window) || o->window < 0)
                return usage_error("--window needs an integer >= 0, got '%s'", v);
            break;
        case OPT_REPEAT:
            if (!parse_long(v, &o->repeat) || o->repeat < 1 || o->repeat > 100000)
                return usage_error("--repeat needs an integer in 1..100000, got '%s'", v);
            break;
        case OPT_SCALE: {
            char *end;
            o->scale = strtod(v, &end);
            /* what the library takes (castle.h): 0 (1/sqrt(d)) or a float in (0, CASTLE_MAX_SCALE]; a
               positive value that rounds to float 0 would silently mean 1/sqrt(d) */
            if (end == v || *end || !(o->scale >= 0) || o->scale > CASTLE_MAX_SCALE ||
                (o->scale > 0 && (float)o->scale == 0.0f))
                return usage_error("--scale needs 0 (1/sqrt(d)) or a float32 number in (0, 65536], got '%s'", v);
            break;
        }
        case OPT_SHAPE: {
            int used = 0;
            /* digits and commas only: %zu would take "-2" (wrapped) and " 2" */
            if (strspn(v, "0123456789,") != strlen(v) ||
                sscanf(v, "%zu,%zu,%zu,%zu%n", &o->shape[0], &o->shape[1], &o->shape[2], &o->shape[3], &used) != 4 ||
                v[used] || !o->shape[0] || !o->shape[1] || !o->shape[2] || !o->shape[3])
                return usage_error("--shape needs four positive integers B,H,L,d, got '%s'", v);
            _Static_assert(CASTLE_MAX_HEAD_DIM == 256, "the message below says 256");
            if (o->shape[3] > CASTLE_MAX_HEAD_DIM) /* inputs no operation takes */
                return usage_error("--shape's d must be in 1..256 (CASTLE_MAX_HEAD_DIM), got '%s'", v);
            break;
        }
        case OPT_PROMPT:
            if (!parse_long(v, &o->prompt) || o->prompt < 0)
                return usage_error("--prompt needs an integer >= 0, got '%s'", v);
            break;
        case OPT_CHUNK:
            if (!parse_long(v, &o->chunk) || o->chunk < 1)
                return usage_error("--chunk needs an integer >= 1, got '%s'", v);
            break;
        case OPT_SEED: {
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (end == v || *end || errno || v[0] == '-')
                return usage_error("--seed needs a non-negative integer, got '%s'", v);
            break;
        }
        case ':':
            return usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (random) {
        if (!o->shape[0])
            return usage_error("%s", "random needs --shape B,H,L,d");
        if (!o->out)
            return usage_error("%s", "--out DIR is required");
        return 0;
    }
    if (!o->in)
        return usage_error("%s", "--in DIR is required");
    if (decode && o->prompt < 0)
        return usage_error("%s", "decode needs --prompt P");
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
        if (shape[3] > CASTLE_MAX_HEAD_DIM) {
            fprintf(stderr, "castle-run: %s: head dim d = %zu; libcastle supports 1..%d\n", path, shape[3],
                    CASTLE_MAX_HEAD_DIM);
            return 2;
        }
    } else if (memcmp(shape, a->shape, 4 * sizeof(size_t))) {
        fprintf(stderr, "castle-run: %s: shape (%zu, %zu, %zu, %zu) disagrees with qu.npy (%zu, %zu, %zu, %zu)\n", path,
                a->shape[0], a->shape[1], a->shape[2], a->shape[3], shape[0], shape[1], shape[2], shape[3]);
        return 2;
    }
    return 0;
}

static int lib_error(castle_status st, const char *what) { return tool_fail("castle-run", st, what); }

/* A device buffer of `bytes`, initialised from host when given; on failure says which buffer and how
   large (the usual reason: the device's max allocation or memory). */
static cl_mem new_buffer(cl_context clc, const char *name, size_t bytes, void *host, int *rc)
{
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(clc, host ? CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR : CL_MEM_READ_WRITE, bytes, host,
                              &err);
    if (!m) {
        fprintf(stderr, "castle-run: could not allocate the device buffer %s of %zu bytes: %s\n", name, bytes,
                castle_status_string((castle_status)err));
        *rc = 1;
    }
    return m;
}

/* The buffers of one forward (+ backward) problem, indexed by castle_tensor, and the workspace. */
typedef struct job {
    castle_context *ctx;
    cl_command_queue q;
    castle_attention_desc desc;
    cl_mem buf[CASTLE_TENSOR_COUNT], ws;
    castle_cache *cache; /* decode */
} job;

#define WAIT1(w) ((w) ? 1u : 0u), ((w) ? &(w) : NULL)

static castle_status op_forward(void *state, cl_event wait, cl_event *ev)
{
    job *j = state;
    cl_mem *b = j->buf;
    return castle_forward(j->ctx, &j->desc, b[0], b[1], b[2], b[3], b[4], b[5], b[CASTLE_TENSOR_O],
                          b[CASTLE_TENSOR_LSE], j->ws, j->q, WAIT1(wait), ev);
}

static castle_status op_backward(void *state, cl_event wait, cl_event *ev)
{
    job *j = state;
    cl_mem *b = j->buf;
    return castle_backward(j->ctx, &j->desc, b[0], b[1], b[2], b[3], b[4], b[5], b[CASTLE_TENSOR_O],
                           b[CASTLE_TENSOR_LSE], j->ws, b[CASTLE_TENSOR_DO], b[CASTLE_TENSOR_DQU], b[CASTLE_TENSOR_DKU],
                           b[CASTLE_TENSOR_DVU], b[CASTLE_TENSOR_DQC], b[CASTLE_TENSOR_DKC], b[CASTLE_TENSOR_DVC], j->q,
                           WAIT1(wait), ev);
}

/* One warm-up, then n timed runs of op (tools/tool.h); prints median_ms=... clock=device|host. */
static int time_op(job *j, tool_run_fn op, const char *name, long n)
{
    tool_timing t;
    castle_status st = tool_time(j->q, op, j, 1, n, &t);
    if (st)
        return lib_error(st, name);
    printf("median_ms=%.3f clock=%s\n", t.ms, t.clock);
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

/* Reads a device buffer of n floats and writes it as DIR/name.npy. */
static int save_buffer(cl_command_queue q, cl_mem buf, size_t n, const char *dir, const char *name, int ndim,
                       const size_t *shape)
{
    float *host = malloc(n * sizeof(float));
    if (!host)
        return lib_error(CASTLE_ERR_OUT_OF_HOST_MEMORY, "malloc");
    cl_int err = clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n * sizeof(float), host, 0, NULL, NULL);
    int rc = err != CL_SUCCESS ? lib_error((castle_status)err, "reading results")
                               : write_output(dir, name, host, ndim, shape);
    free(host);
    return rc;
}

/* forward, and with `backward` also the backward pass (inputs + do.npy; gradients out). */
static int cmd_train(const options *opt, bool backward)
{
    static const char *const grad_names[6] = {"dqu", "dku", "dvu", "dqc", "dkc", "dvc"};
    size_t shape[4] = {0, 0, 0, 0};
    npy_array arr[7];
    memset(arr, 0, sizeof arr);
    const int nin = backward ? 7 : 6;
    int rc = 0;
    for (int t = 0; t < nin && !rc; ++t)
        rc = read_input(opt->in, t < 6 ? in_names[t] : "do", shape, &arr[t]);
    job j;
    memset(&j, 0, sizeof j);
    if (rc)
        goto done;
    if ((rc = tool_open_device("castle-run", opt->device, &j.ctx)))
        goto done;
    cl_context clc = castle_context_cl_context(j.ctx);
    cl_command_queue q = j.q = castle_context_queue(j.ctx);
    castle_attention_desc_init(&j.desc, shape[0], shape[1], shape[2], shape[3]);
    j.desc.window = opt->window;
    j.desc.scale = (float)opt->scale;
    const size_t n = arr[0].count, nl = shape[0] * shape[1] * shape[2];
    size_t ws_bytes = 0;
    castle_status st = castle_forward_workspace_size(j.ctx, &j.desc, &ws_bytes);
    if (st) {
        rc = lib_error(st, "castle_forward_workspace_size");
        goto done;
    }
    const int ntensors = backward ? CASTLE_TENSOR_COUNT : CASTLE_TENSOR_LSE + 1;
    for (int t = 0; t < ntensors && !rc; ++t) {
        const int src = t < 6 ? t : (t == CASTLE_TENSOR_DO ? 6 : -1);
        const size_t count = t == CASTLE_TENSOR_LSE ? nl : n;
        j.buf[t] = new_buffer(clc, tensor_names[t], count * sizeof(float), src >= 0 ? arr[src].data : NULL, &rc);
    }
    if (!rc)
        j.ws = new_buffer(clc, "workspace", ws_bytes, NULL, &rc);
    if (rc)
        goto done;
    if ((st = op_forward(&j, NULL, NULL))) {
        rc = lib_error(st, "castle_forward");
        goto done;
    }
    if (backward && (st = op_backward(&j, NULL, NULL))) {
        rc = lib_error(st, "castle_backward");
        goto done;
    }
    if (backward) {
        for (int k = 0; k < 6 && !rc; ++k)
            rc = save_buffer(q, j.buf[CASTLE_TENSOR_DQU + k], n, opt->out, grad_names[k], 4, shape);
    } else {
        if (!(rc = save_buffer(q, j.buf[CASTLE_TENSOR_O], n, opt->out, "o", 4, shape)))
            rc = save_buffer(q, j.buf[CASTLE_TENSOR_LSE], nl, opt->out, "lse", 3, shape);
    }
    if (!rc && opt->repeat > 0)
        rc = backward ? time_op(&j, op_backward, "castle_backward", opt->repeat)
                      : time_op(&j, op_forward, "castle_forward", opt->repeat);
done:
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t)
        if (j.buf[t])
            clReleaseMemObject(j.buf[t]);
    for (int t = 0; t < 7; ++t)
        npy_free(&arr[t]);
    if (j.ws)
        clReleaseMemObject(j.ws);
    tool_close_device(j.ctx);
    return rc;
}

/* ---- decode: prefill, then decode through the UQ-KV cache ---- */

/* Appends desc.seq_len tokens (buf[QU..VC], packed) to the cache; outputs to buf[O]. */
static castle_status op_decode(void *state, cl_event wait, cl_event *ev)
{
    job *j = state;
    cl_mem *b = j->buf;
    return castle_decode(j->ctx, j->cache, &j->desc, b[0], b[1], b[2], b[3], b[4], b[5], b[CASTLE_TENSOR_O], NULL,
                         j->q, WAIT1(wait), ev);
}

/* Copies rows [r0, r0 + k) of each (b, h) slice between a (B, H, L, d) buffer and a packed
   (B, H, k, d) one (to_full: staging -> full). */
static cl_int copy_rows(cl_command_queue q, cl_mem full, cl_mem part, const size_t shape[4], size_t r0, size_t k,
                        bool to_full)
{
    const size_t row = shape[3] * sizeof(float);
    const size_t at_full[3] = {r0 * row, 0, 0}, at_part[3] = {0, 0, 0}, region[3] = {k * row, shape[0] * shape[1], 1};
    return to_full ? clEnqueueCopyBufferRect(q, part, full, at_part, at_full, region, k * row, 0, shape[2] * row, 0, 0,
                                             NULL, NULL)
                   : clEnqueueCopyBufferRect(q, full, part, at_full, at_part, region, shape[2] * row, 0, k * row, 0, 0,
                                             NULL, NULL);
}

static int cmd_decode(const options *opt)
{
    size_t shape[4] = {0, 0, 0, 0};
    npy_array arr[6];
    memset(arr, 0, sizeof arr);
    int rc = 0;
    for (int t = 0; t < 6 && !rc; ++t)
        rc = read_input(opt->in, in_names[t], shape, &arr[t]);
    job j;
    memset(&j, 0, sizeof j);
    cl_mem full[7] = {0}; /* the six inputs and o, (B, H, L, d) */
    if (rc)
        goto done;
    const size_t B = shape[0], H = shape[1], L = shape[2], d = shape[3], n = arr[0].count;
    const size_t P = (size_t)opt->prompt, C = (size_t)opt->chunk < L ? (size_t)opt->chunk : L;
    if (P > L) {
        fprintf(stderr, "castle-run: --prompt %zu exceeds the inputs' length L = %zu\n", P, L);
        rc = 2;
        goto done;
    }
    if ((rc = tool_open_device("castle-run", opt->device, &j.ctx)))
        goto done;
    cl_context clc = castle_context_cl_context(j.ctx);
    cl_command_queue q = j.q = castle_context_queue(j.ctx);
    castle_status st;
    castle_attention_desc desc; /* the cache: room for the timed tokens too */
    castle_attention_desc_init(&desc, B, H, L + (opt->repeat > 0 ? (size_t)opt->repeat + 1 : 0), d);
    desc.window = opt->window;
    desc.scale = (float)opt->scale;
    if ((st = castle_cache_create(j.ctx, &desc, &j.cache))) {
        rc = lib_error(st, "castle_cache_create");
        goto done;
    }
    for (int t = 0; t < 7 && !rc; ++t)
        full[t] = new_buffer(clc, tensor_names[t], n * sizeof(float), t < 6 ? arr[t].data : NULL, &rc);
    for (int t = 0; t <= CASTLE_TENSOR_O && !rc; ++t) { /* staging for C tokens */
        char name[32];
        snprintf(name, sizeof name, "%s (staging)", tensor_names[t]);
        j.buf[t] = new_buffer(clc, name, B * H * C * d * sizeof(float), NULL, &rc);
    }
    if (rc)
        goto done;
    cl_int err = CL_SUCCESS;
    if (P > 0) { /* the prompt straight from the full tensors: seq_len P, their strides */
        desc.seq_len = P;
        for (int t = 0; t <= CASTLE_TENSOR_O; ++t)
            desc.layout[t] = (castle_layout){H * L * d, L * d, d};
        if ((st = castle_prefill(j.ctx, j.cache, &desc, NULL, full[0], full[1], full[2], full[3], full[4], full[5],
                                 full[6], NULL, q, 0, NULL, NULL))) {
            rc = lib_error(st, "castle_prefill");
            goto done;
        }
    }
    j.desc = desc;
    memset(j.desc.layout, 0, sizeof j.desc.layout); /* packed staging */
    for (size_t pos = P; pos < L; pos += C) {
        const size_t k = L - pos < C ? L - pos : C;
        j.desc.seq_len = k;
        for (int t = 0; t < 6 && err == CL_SUCCESS; ++t)
            err = copy_rows(q, full[t], j.buf[t], shape, pos, k, false);
        if (err != CL_SUCCESS) {
            rc = lib_error((castle_status)err, "clEnqueueCopyBufferRect");
            goto done;
        }
        if ((st = op_decode(&j, NULL, NULL))) {
            rc = lib_error(st, "castle_decode");
            goto done;
        }
        if ((err = copy_rows(q, full[6], j.buf[CASTLE_TENSOR_O], shape, pos, k, true)) != CL_SUCCESS) {
            rc = lib_error((castle_status)err, "clEnqueueCopyBufferRect");
            goto done;
        }
    }
    if ((rc = save_buffer(q, full[6], n, opt->out, "o", 4, shape)))
        goto done;
    if (opt->repeat > 0) { /* one-token decodes on top of the L cached tokens (inputs: the last row) */
        j.desc.seq_len = 1;
        for (int t = 0; t < 6 && err == CL_SUCCESS; ++t)
            err = copy_rows(q, full[t], j.buf[t], shape, L - 1, 1, false);
        if (err != CL_SUCCESS) {
            rc = lib_error((castle_status)err, "clEnqueueCopyBufferRect");
            goto done;
        }
        size_t bytes = 0;
        castle_cache_bytes(j.cache, &bytes);
        if (!(rc = time_op(&j, op_decode, "castle_decode", opt->repeat)))
            printf("cache_bytes=%zu\n", bytes);
    }
done:
    for (int t = 0; t < 7; ++t)
        if (full[t])
            clReleaseMemObject(full[t]);
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t)
        if (j.buf[t])
            clReleaseMemObject(j.buf[t]);
    for (int t = 0; t < 6; ++t)
        npy_free(&arr[t]);
    castle_cache_destroy(j.cache);
    tool_close_device(j.ctx);
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
    for (int t = 0; t < 7 && !rc; ++t) {
        for (size_t i = 0; i < n; ++i) /* splitmix64; 24 bits make an exact float in [-1, 1) */
            data[i] = (float)(mix64(s += 0x9e3779b97f4a7c15ull) >> 40) * 0x1p-23f - 1.0f;
        rc = write_output(opt->out, t < 6 ? in_names[t] : "do", data, 4, opt->shape);
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
    if (!strcmp(opt.cmd, "random"))
        return cmd_random(&opt);
    if (!strcmp(opt.cmd, "decode"))
        return cmd_decode(&opt);
    return cmd_train(&opt, !strcmp(opt.cmd, "backward"));
}
