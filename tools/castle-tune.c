/* castle-tune: searches the tuning parameters (castle.h's CASTLE_TUNING_PARAMS) for one device,
 * verifies the winner against the fp64 reference, and writes it to the per-device tuning file that
 * castle_context_create loads (see castle.h, "Tuning").  Also prints the winner as an entry for the
 * built-in table in host/tuning.c. */
#define _XOPEN_SOURCE 700 /* POSIX 2008 with realpath */
#include "castle/castle.h"
#include "harness.h"
#include "local_memory.h" /* CASTLE_MT_TILES, the kernels' tile count */
#include "tool.h"
#include "tolerance.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stddef.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "usage: castle-tune [--device P:D] [--L N] [--d N] [--heads N] [--repeat N] [--max-tiles N] [--budget S]\n"
    "                   [--file PATH] [--dry-run] [--quick]\n"
    "\n"
    "Times castle_forward + castle_backward (B=1, H=heads, L, d) under candidate tunings, in\n"
    "stages: every valid micro-tile shape (threads x vector x tm x tn) at the starting block and dchunk,\n"
    "the nearest to the start first, with the forward and the backward on the same shape, then every\n"
    "block x dchunk with the best shape (threads adjusted to fit), then the backward's own work-group\n"
    "size and micro-tile rows (bthreads x btm), then the forward's own work-group size and d chunk\n"
    "(fthreads x fdchunk), and the staging order (stage); then, on devices whose compiler takes NVIDIA's\n"
    "register cap (cl_nv_compiler_options), the forwards' cap (fregs) and the rest's (regs), each at 64,\n"
    "72, 80, 96, 128 and 168 registers a work-item.  The start as it is stays a candidate;\n"
    "prefetch stays as the start has it (it needs a compiler with __builtin_prefetch), and so do decode\n"
    "and accum (they shape the decode and causal kernels, which are not timed here; accum also whether\n"
    "the backward's loops unroll).  The causal forward, not timed either, runs under fthreads x fdchunk\n"
    "too.  Each candidate runs on a fresh library context; one the device\n"
    "rejects is counted as skipped, one that fails to build or run is listed ('fail ...') and makes the\n"
    "exit status 1 (the winner is still written).  A candidate whose work-items would own more than\n"
    "--max-tiles micro-tiles of a block's product (forward or backward) is listed ('over ...') and not\n"
    "built: such shapes are slow to compile (64 tiles: 15 minutes on PoCL) and slow to run.  Each line\n"
    "gives the seconds its candidate took to build and time.\n"
    "The winner is checked against the fp64 reference (forward and gradients), then written to the\n"
    "tuning file as the entry for this device name and driver version (other devices' entries kept).\n"
    "\n"
    "options:\n"
    "  --device P:D   OpenCL platform:device or flat index (default: $CASTLE_DEVICE, else 0:0)\n"
    "  --L N          sequence length to tune at (default 1024)\n"
    "  --d N          head dim, 1..256 (default 64)\n"
    "  --heads N      heads (default 4; --L, --heads, --repeat and --max-tiles are at most 1000000)\n"
    "  --repeat N     timed runs per candidate, median taken (default 3)\n"
    "  --max-tiles N  most micro-tiles per work-item of a candidate that is built (default 16)\n"
    "  --budget S     start no candidate after S seconds of search (0: the start alone); the ones left\n"
    "                 are listed ('late ...'), the best so far is verified and written (default: none)\n"
    "  --file PATH    tuning file (default: $CASTLE_TUNING_FILE, else $XDG_CONFIG_HOME/castle/tuning.tsv,\n"
    "                 else ~/.config/castle/tuning.tsv)\n"
    "  --dry-run      search and verify, but do not write the file\n"
    "  --quick        a reduced search: the starting tuning and the first other micro-tile shape (for\n"
    "                 tests)\n"
    "  -h, --help     this text\n"
    "\n"
    "exit status: 0 success, 1 library, device or file failure or a candidate that failed, 2 bad usage\n";

typedef struct options {
    const char *device, *file;
    size_t L, d, heads;
    long repeat;
    unsigned max_tiles;
    long budget; /* seconds, -1: none */
    bool dry, quick;
} options;

static int bad_usage(const char *msg, const char *arg)
{
    fprintf(stderr, "castle-tune: %s '%s'\n(run castle-tune --help for usage)\n", msg, arg);
    return 2;
}

_Static_assert(CASTLE_MAX_HEAD_DIM == 256, "castle-tune's --d message and --help name 256");

/* A positive integer option value (at most 1000000) into *x; false when v is anything else. */
static bool parse_count(const char *v, unsigned long long *x)
{
    char *end;
    errno = 0;
    *x = strtoull(v, &end, 10);
    return end != v && !*end && !errno && v[0] >= '0' && v[0] <= '9' && *x > 0 && *x <= 1000000; /* no sign, no space */
}

static int parse_args(int argc, char **argv, options *o)
{
    enum {
        OPT_DEVICE = 256, OPT_FILE, OPT_L, OPT_D, OPT_HEADS, OPT_REPEAT, OPT_MAX_TILES, OPT_BUDGET, OPT_DRY, OPT_QUICK
    };
    static const struct option longopts[] = {
        {"device", required_argument, NULL, OPT_DEVICE}, {"file", required_argument, NULL, OPT_FILE},
        {"L", required_argument, NULL, OPT_L},           {"d", required_argument, NULL, OPT_D},
        {"heads", required_argument, NULL, OPT_HEADS},   {"repeat", required_argument, NULL, OPT_REPEAT},
        {"max-tiles", required_argument, NULL, OPT_MAX_TILES}, {"budget", required_argument, NULL, OPT_BUDGET},
        {"dry-run", no_argument, NULL, OPT_DRY},         {"quick", no_argument, NULL, OPT_QUICK},
        {"help", no_argument, NULL, 'h'},                {NULL, 0, NULL, 0}};
    memset(o, 0, sizeof *o);
    o->L = 1024;
    o->d = 64;
    o->heads = 4;
    o->repeat = 3;
    o->max_tiles = 16;
    o->budget = -1;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
        unsigned long long x = 0;
        switch (c) {
        case 'h':
            fputs(usage, stdout);
            exit(0);
        case OPT_DEVICE:
            o->device = optarg;
            break;
        case OPT_FILE:
            o->file = optarg;
            break;
        case OPT_DRY:
            o->dry = true;
            break;
        case OPT_QUICK:
            o->quick = true;
            break;
        case OPT_BUDGET: /* 0 allowed: the start alone */
            if (strcmp(optarg, "0") && !parse_count(optarg, &x))
                return bad_usage("expected a number of seconds (0 to 1000000), got", optarg);
            o->budget = (long)x;
            break;
        case OPT_L:
        case OPT_D:
        case OPT_HEADS:
        case OPT_REPEAT:
        case OPT_MAX_TILES:
            if (!parse_count(optarg, &x))
                return bad_usage("expected an integer from 1 to 1000000, got", optarg);
            if (c == OPT_L)
                o->L = (size_t)x;
            else if (c == OPT_D && x > CASTLE_MAX_HEAD_DIM)
                return bad_usage("--d must be in 1..256 (CASTLE_MAX_HEAD_DIM), got", optarg);
            else if (c == OPT_D)
                o->d = (size_t)x;
            else if (c == OPT_HEADS)
                o->heads = (size_t)x;
            else if (c == OPT_MAX_TILES)
                o->max_tiles = (unsigned)x;
            else
                o->repeat = (long)x;
            break;
        case ':':
            return bad_usage("missing value for", argv[optind - 1]);
        default:
            return bad_usage("unknown option", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bad_usage("unexpected argument", argv[optind]);
    return 0;
}

typedef struct tuner {
    castle_context *ctx; /* the device's context: buffers, queue, validity checks; runs nothing */
    castle_context *run; /* the candidate's own context (fresh per candidate: programs are released) */
    int tried, skipped, failed, over; /* over: more micro-tiles per work-item than --max-tiles */
    int late;                         /* not started: --budget spent */
    double start_ms;                  /* when the search began (tool_now_ms) */
    cl_context clc;
    cl_command_queue q;
    castle_attention_desc desc;
    cl_mem buf[CASTLE_TENSOR_COUNT];
    const options *opt;
} tuner;

/* One timed run for tool_time: the candidate's forward, then its backward. */
typedef struct candidate_run {
    tuner *tu;
    cl_mem ws;
} candidate_run;

static castle_status run_candidate(void *state, cl_event wait, cl_event *end)
{
    const candidate_run *cr = state;
    tuner *tu = cr->tu;
    cl_mem *b = tu->buf;
    cl_event mid = NULL;
    castle_status st = castle_forward(tu->run, &tu->desc, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], cr->ws,
                                      tu->q, wait ? 1 : 0, wait ? &wait : NULL, &mid);
    if (st == CASTLE_SUCCESS)
        st = castle_backward(tu->run, &tu->desc, b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], cr->ws, b[8], b[9],
                             b[10], b[11], b[12], b[13], b[14], tu->q, 1, &mid, end);
    if (mid)
        clReleaseEvent(mid);
    return st;
}

/* Median ms of forward + backward under the candidate context's tuning (tools' shared timer: one
   warm-up run, which compiles the kernels, then --repeat timed runs); < 0 on failure. */
static double time_candidate(tuner *tu, const char **clock)
{
    size_t ws_bytes = 0;
    if (castle_forward_workspace_size(tu->run, &tu->desc, &ws_bytes))
        return -1;
    cl_int err;
    candidate_run cr = {tu, clCreateBuffer(tu->clc, CL_MEM_READ_WRITE, ws_bytes, NULL, &err)};
    if (!cr.ws)
        return -1;
    tool_timing t;
    const castle_status st = tool_time(tu->q, run_candidate, &cr, 1, tu->opt->repeat, &t);
    clReleaseMemObject(cr.ws);
    *clock = t.clock;
    return st == CASTLE_SUCCESS ? t.ms : -1;
}

/* The most micro-tiles a work-item owns in one product of a block pair (cl/common.cl's FUPT and
   FUPC; the backward's slabs, cl/backward.cl's BW_FUPS, are at most a block wide, so FUPT bounds
   them), forward or backward, under r as the library installed it (derived values filled in). */
static unsigned tiles_per_item(const castle_tuning *r)
{
    const unsigned threads[2] = {r->fthreads, r->bthreads}, tm[2] = {r->tm, r->btm};
    const unsigned chunk[2] = {r->fdchunk, r->dchunk};
    unsigned most = 0;
    for (int k = 0; k < 2; ++k) {
        const unsigned width = chunk[k] > r->block ? chunk[k] : r->block; /* the wider of FUPT's and FUPC's */
        const unsigned n = CASTLE_MT_TILES(r->block, width, tm[k], r->tn * r->vector) / threads[k];
        most = n > most ? n : most;
    }
    return most;
}

/* What a candidate is subject to: --max-tiles, --budget (the start: neither). */
enum { CAP_TILES = 1, CAP_BUDGET = 2, CAP_ALL = 3 };

/* Tries t on a fresh context: returns its time, or -1 when the device rejects it (counted as
   skipped) or it fails to build or run (listed on stderr, counted as failed), or -2 when its work-items
   would own more than --max-tiles micro-tiles (CAP_TILES; listed, counted as over, not built) or the
   --budget is spent (CAP_BUDGET; listed, counted as late, not built). */
static double try_tuning(tuner *tu, const castle_tuning *t, int caps)
{
    char ts[256];
    castle_tuning_string(t, ts, sizeof ts);
    if (castle_context_set_tuning(tu->ctx, t) != CASTLE_SUCCESS) {
        ++tu->skipped;
        return -1;
    }
    castle_tuning r = {.struct_size = sizeof r};
    const unsigned tiles = castle_context_get_tuning(tu->ctx, &r) == CASTLE_SUCCESS ? tiles_per_item(&r) : 0;
    if ((caps & CAP_TILES) && tiles > tu->opt->max_tiles) {
        ++tu->over;
        printf("  over %s: %u micro-tiles per work-item (--max-tiles %u), not built\n", ts, tiles,
               tu->opt->max_tiles);
        fflush(stdout);
        return -2;
    }
    if ((caps & CAP_BUDGET) && tu->opt->budget >= 0 &&
        tool_now_ms() - tu->start_ms >= 1e3 * (double)tu->opt->budget) {
        ++tu->late;
        printf("  late %s: --budget %ld s spent, not built\n", ts, tu->opt->budget);
        fflush(stdout);
        return -2;
    }
    ++tu->tried;
    const double t0 = tool_now_ms();
    double ms = -1;
    const char *clock = "device";
    if (castle_context_create(castle_context_cl_context(tu->ctx), castle_context_device(tu->ctx), &tu->run) ==
            CASTLE_SUCCESS &&
        castle_context_set_tuning(tu->run, t) == CASTLE_SUCCESS)
        ms = time_candidate(tu, &clock);
    if (ms < 0) {
        ++tu->failed;
        fprintf(stderr, "  fail %s: %s\n", ts, castle_last_error());
    } else {
        printf("  %s  forward+backward %.3f ms clock=%s (built and timed in %.0f s)\n", ts, ms, clock,
               (tool_now_ms() - t0) / 1e3);
    }
    castle_context_destroy(tu->run);
    tu->run = NULL;
    fflush(stdout);
    return ms;
}

/* Keeps the faster of *best (time *best_ms) and t; caps: what t is subject to (try_tuning). */
static void consider(tuner *tu, const castle_tuning *t, int caps, castle_tuning *best, double *best_ms)
{
    const double ms = try_tuning(tu, t, caps);
    if (ms > 0 && (*best_ms < 0 || ms < *best_ms)) {
        /* as the library installed it (try_tuning left it on tu->ctx): the derived parameters filled in */
        castle_tuning r = {.struct_size = sizeof r};
        *best = castle_context_get_tuning(tu->ctx, &r) == CASTLE_SUCCESS ? r : *t;
        *best_ms = ms;
    }
}

/* The parameter at byte offset off of t (a field of castle.h's CASTLE_TUNING_PARAMS). */
static unsigned *field_at(castle_tuning *t, size_t off) { return (unsigned *)((char *)t + off); }

/* A family's own shape (stages 3 and 4): its work-group size, field th (0: following threads), x a
   second parameter, field p (0: following field follow), th over [th_lo, th_hi] and p over [lo, hi]
   in powers of two, under the rest of *best; the pair the best already runs is not timed again. */
static void own_shape_stage(tuner *tu, size_t th, size_t p, size_t follow, unsigned th_lo, size_t th_hi,
                            unsigned lo, unsigned hi, castle_tuning *best, double *best_ms)
{
    castle_tuning base = *best;
    const unsigned th0 = *field_at(&base, th) ? *field_at(&base, th) : base.threads;
    const unsigned p0 = *field_at(&base, p) ? *field_at(&base, p) : *field_at(&base, follow);
    for (unsigned n = th_lo; n <= th_hi; n *= 2)
        for (unsigned v = lo; v <= hi; v *= 2) {
            castle_tuning t = base;
            *field_at(&t, th) = n;
            *field_at(&t, p) = v;
            if (n != th0 || v != p0)
                consider(tu, &t, CAP_ALL, best, best_ms);
        }
}

/* A stage-1 candidate: its tuning, its distance from the start (log2 steps summed over threads,
   vector, tm and tn) and its place in the enumeration (the tie-break: qsort is not stable). */
typedef struct shape_entry {
    castle_tuning t;
    unsigned dist;
    size_t index;
} shape_entry;

/* |log2(a / b)| for powers of two a, b > 0 (0 when either is 0). */
static unsigned log2_ratio(unsigned a, unsigned b)
{
    unsigned n = 0;
    if (!a || !b)
        return 0;
    for (; a > b; a /= 2)
        ++n;
    for (; b > a; b /= 2)
        ++n;
    return n;
}

static int shape_order(const void *x, const void *y)
{
    const shape_entry *a = x, *b = y;
    if (a->dist != b->dist)
        return a->dist < b->dist ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* The directory part of path into dir: "." where it has none, "/" for a file in the root. */
static void dir_of(const char *path, char *dir, size_t n)
{
    snprintf(dir, n, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *(slash == dir ? slash + 1 : slash) = '\0';
    else
        snprintf(dir, n, ".");
}

/* mkdir -p of the directory part of path (errors show when the file is opened; "." and "/" exist). */
static void make_parents(const char *path)
{
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    for (char *p = dir + 1; *p; ++p)
        if (*p == '/') {
            *p = '\0';
            mkdir(dir, 0755);
            *p = '/';
        }
    mkdir(dir, 0755);
}

/* The file path_arg names, through symbolic links (write_entry writes through them), and its lock
   file, <file>.lock beside it; a new file's path is its own. */
static void resolved(const char *path_arg, char *path, size_t n, char *lockpath, size_t nlock)
{
    char buf[PATH_MAX];
    snprintf(path, n, "%s", realpath(path_arg, buf) ? buf : path_arg);
    snprintf(lockpath, nlock, "%s.lock", path);
}

/* Before the search, so that a search of hours does not end in "cannot write": an existing tuning
   file must be a regular file (not a device such as /dev/null, which the rename would replace, nor
   a FIFO, whose open would wait) that this process may read and write, beside which its lock file
   can be made and its temporary file written; a new one's directory is made (mkdir -p) and must be
   writable.  0, or the exit status after a message. */
static int check_file(const char *path)
{
    struct stat st;
    if (!*path) {
        fprintf(stderr, "castle-tune: the tuning file's path is empty\n");
        return 2;
    }
    if (stat(path, &st) == 0) {
        if (!S_ISREG(st.st_mode)) {
            fprintf(stderr, "castle-tune: %s is not a regular file (a directory, device or FIFO): name a file\n",
                    path);
            return 1;
        }
        if (access(path, R_OK | W_OK) != 0) {
            fprintf(stderr, "castle-tune: cannot read and write %s: %s\n", path, strerror(errno));
            return 1;
        }
        /* write_entry also creates <file>.lock and a temporary file beside the file (the file a link
           names), and renames: the lock file is made now, where a folder that cannot be written
           would otherwise fail the run after its search */
        char file[4096], lockpath[4200], lockdir[4200];
        resolved(path, file, sizeof file, lockpath, sizeof lockpath);
        dir_of(lockpath, lockdir, sizeof lockdir);
        const int lk = open(lockpath, O_RDWR | O_CREAT, 0644);
        if (lk < 0 || access(lockdir, W_OK | X_OK) != 0) {
            fprintf(stderr, "castle-tune: cannot write beside %s (its lock file and temporary file): %s\n", path,
                    strerror(errno));
            if (lk >= 0)
                close(lk);
            return 1;
        }
        close(lk);
        return 0;
    }
    if (errno != ENOENT) {
        fprintf(stderr, "castle-tune: cannot use %s: %s\n", path, strerror(errno));
        return 1;
    }
    make_parents(path);
    char dir[4096];
    dir_of(path, dir, sizeof dir);
    if (access(dir, W_OK | X_OK) != 0) {
        fprintf(stderr, "castle-tune: cannot create %s: %s: %s\n", path, dir, strerror(errno));
        return 1;
    }
    return 0;
}

/* Writes (or replaces) this device's line in the tuning file, under a lock (<file>.lock, a POSIX
   record lock) so that castle-tune runs on other devices writing the same file keep each other's
   lines: read, edit, write a temporary file, rename it over the file.  A symbolic link is written
   through (the file it names is replaced, the link stays); the file keeps its permissions. */
static int write_entry(const char *path_arg, const char *device, const char *driver, const castle_tuning *t)
{
    char path[4096], lockpath[4200], tmp[4200];
    resolved(path_arg, path, sizeof path, lockpath, sizeof lockpath);
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    make_parents(path);
    const int lk = open(lockpath, O_RDWR | O_CREAT, 0644);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if (lk < 0 || fcntl(lk, F_SETLKW, &fl) != 0) {
        fprintf(stderr, "castle-tune: cannot lock %s: %s\n", lockpath, strerror(errno));
        if (lk >= 0)
            close(lk);
        return 1;
    }
    int rc = 1;
    char *old = NULL, *line = NULL;
    size_t old_len = 0, cap = 0;
    mode_t mode = 0644;
    FILE *f = fopen(path, "r");
    if (!f && errno != ENOENT) { /* there but unreadable: writing would lose its other lines */
        fprintf(stderr, "castle-tune: cannot read %s: %s\n", path, strerror(errno));
        goto out;
    }
    if (f) { /* every line but this device and driver's entry, whole and byte for byte (NULs too) */
        struct stat st;
        if (fstat(fileno(f), &st) == 0)
            mode = st.st_mode & 07777;
        ssize_t n;
        const size_t dn = strlen(device), vn = strlen(driver);
        while ((n = getline(&line, &cap, f)) > 0) {
            const bool mine = (size_t)n > dn + vn + 1 && !memcmp(line, device, dn) && line[dn] == '\t' &&
                              !memcmp(line + dn + 1, driver, vn) && line[dn + 1 + vn] == '\t';
            if (mine)
                continue;
            const bool ended = line[n - 1] == '\n';
            char *grown = realloc(old, old_len + (size_t)n + 2);
            if (!grown) {
                fprintf(stderr, "castle-tune: out of memory\n");
                goto out;
            }
            old = grown;
            memcpy(old + old_len, line, (size_t)n);
            old_len += (size_t)n;
            if (!ended) /* a last line without its newline: the entry must not join it */
                old[old_len++] = '\n';
        }
        const bool bad = ferror(f);
        fclose(f);
        f = NULL;
        if (bad) {
            fprintf(stderr, "castle-tune: cannot read %s\n", path);
            goto out;
        }
    }
    const int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, mode);
    if (fd < 0 || !(f = fdopen(fd, "w"))) {
        fprintf(stderr, "castle-tune: cannot write %s: %s\n", tmp, strerror(errno));
        if (fd >= 0)
            close(fd);
        goto out;
    }
    if (!old_len)
        fputs("# libcastle tuning file (written by castle-tune): device name, driver version, tuning\n", f);
    else
        fwrite(old, 1, old_len, f);
    char ts[256];
    castle_tuning_string(t, ts, sizeof ts);
    fprintf(f, "%s\t%s\t%s\n", device, driver, ts);
    const bool written = !ferror(f);
    if (fclose(f) != 0 || !written || rename(tmp, path) != 0) {
        fprintf(stderr, "castle-tune: cannot write %s: %s\n", path, strerror(errno));
        remove(tmp);
    } else {
        rc = 0;
    }
    f = NULL;
out:
    if (f)
        fclose(f);
    free(old);
    free(line);
    close(lk); /* releases the lock */
    return rc;
}

int main(int argc, char **argv)
{
    options opt;
    int rc = parse_args(argc, argv, &opt);
    if (rc)
        return rc;
    char path[4096] = ""; /* the tuning file, checked before the search (none under --dry-run) */
    if (!opt.dry) {
        if (opt.file)
            snprintf(path, sizeof path, "%s", opt.file);
        else if (castle_tuning_file(path, sizeof path) != CASTLE_SUCCESS) {
            fprintf(stderr, "castle-tune: %s (use --file)\n", castle_last_error());
            return 1;
        }
        if ((rc = check_file(path)))
            return rc;
    }
    tuner tu = {0};
    tu.opt = &opt;
    if ((rc = tool_open_device("castle-tune", opt.device, &tu.ctx)))
        return rc;
    tu.clc = castle_context_cl_context(tu.ctx);
    tu.q = castle_context_queue(tu.ctx);
    cl_device_id dev = castle_context_device(tu.ctx);
    char name[256] = "", driver[256] = "", vendor[256] = "";
    clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name - 1, name, NULL);
    clGetDeviceInfo(dev, CL_DRIVER_VERSION, sizeof driver - 1, driver, NULL);
    clGetDeviceInfo(dev, CL_DEVICE_VENDOR, sizeof vendor - 1, vendor, NULL);
    size_t max_wg = 256;
    clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, NULL);
    char ext[8192] = "";
    clGetDeviceInfo(dev, CL_DEVICE_EXTENSIONS, sizeof ext - 1, ext, NULL);
    const bool nv_options = strstr(ext, "cl_nv_compiler_options") != NULL; /* -cl-nv-maxrregcount */

    castle_attention_desc_init(&tu.desc, 1, opt.heads, opt.L, opt.d);
    const size_t n = opt.heads * opt.L * opt.d;
    float *host = malloc(n * sizeof(float));
    if (!host) {
        fprintf(stderr, "castle-tune: out of host memory for the inputs (%zu floats)\n", n);
        tool_close_device(tu.ctx);
        return 1;
    }
    for (size_t i = 0; i < n; ++i)
        host[i] = (float)h_value(1, 0, 0, 0, i, 0);
    cl_int err = CL_SUCCESS;
    for (int t = 0; t < CASTLE_TENSOR_COUNT && err == CL_SUCCESS; ++t) {
        const size_t count = t == CASTLE_TENSOR_LSE ? n / opt.d : n;
        const bool input = t < CASTLE_TENSOR_O || t == CASTLE_TENSOR_DO;
        tu.buf[t] = clCreateBuffer(tu.clc, CL_MEM_READ_WRITE | (input ? CL_MEM_COPY_HOST_PTR : 0),
                                   count * sizeof(float), input ? host : NULL, &err);
    }
    free(host);
    if (err != CL_SUCCESS) {
        fprintf(stderr, "castle-tune: allocating buffers failed (OpenCL %d)\n", (int)err);
        rc = 1;
        goto done;
    }

    castle_tuning best;
    castle_context_get_tuning(tu.ctx, &best);
    const castle_tuning start = best;
    printf("castle-tune: %s (driver %s), B=1 H=%zu L=%zu d=%zu, start: %s\n", name, driver, opt.heads, opt.L, opt.d,
           castle_context_tuning_name(tu.ctx));
    double best_ms = -1;
    tu.start_ms = tool_now_ms();
    consider(&tu, &best, 0, &best, &best_ms);
    const double start_ms = best_ms;
    const castle_tuning start_run = best; /* as installed, derived parameters filled in */
    /* Stage 1 compares the shapes with the forward and the backward following each, so a start whose
       forward or backward has a shape of its own (the CPU and GPU entries') is timed that way too, and
       kept aside: it wins at the end only if nothing the stages find is faster. */
    const bool own_shape = start_run.bthreads != start_run.threads || start_run.btm != start_run.tm ||
                           start_run.fthreads != start_run.threads || start_run.fdchunk != start_run.dchunk;
    if (own_shape) {
        castle_tuning t = start_run;
        t.bthreads = t.btm = t.fthreads = t.fdchunk = 0;
        best_ms = -1;
        consider(&tu, &t, CAP_BUDGET, &best, &best_ms);
    }
    /* the values each parameter may take (castle.h's list), powers of two where it says so */
    enum { NPARAM = 0
#define COUNT_(field, macro, lo, hi, flags, help) +1
                    CASTLE_TUNING_PARAMS(COUNT_)
#undef COUNT_
    };
    static const struct { unsigned lo, hi; } range[NPARAM] = {
#define RANGE_(field, macro, lo, hi, flags, help) {lo, hi},
        CASTLE_TUNING_PARAMS(RANGE_)
#undef RANGE_
    };
    enum { P_BLOCK, P_THREADS, P_DCHUNK, P_VECTOR, P_TM, P_TN, P_STAGE = 10 };
    _Static_assert(offsetof(castle_tuning, tn) - offsetof(castle_tuning, block) == P_TN * sizeof(unsigned),
                   "P_* follow the order of CASTLE_TUNING_PARAMS");
    _Static_assert(offsetof(castle_tuning, stage) - offsetof(castle_tuning, block) == P_STAGE * sizeof(unsigned),
                   "P_STAGE follows the order of CASTLE_TUNING_PARAMS");
    /* stage 1: every micro-tile shape (threads x vector x tm x tn) at the starting block and dchunk,
       the nearest to the start first (shape_order), so that a search cut short by --budget has tried
       the start's neighbours; --quick keeps the enumeration order (its one shape: see --help) */
    const castle_tuning s1 = best;
    /* room for every combination of the four parameters' ranges (castle.h), so none is dropped */
    const size_t most = (size_t)(log2_ratio(range[P_THREADS].hi, range[P_THREADS].lo) + 1) *
                        (log2_ratio(range[P_VECTOR].hi, range[P_VECTOR].lo) + 1) *
                        (log2_ratio(range[P_TM].hi, range[P_TM].lo) + 1) *
                        (log2_ratio(range[P_TN].hi, range[P_TN].lo) + 1);
    shape_entry *shapes = calloc(most, sizeof *shapes);
    if (!shapes) {
        fprintf(stderr, "castle-tune: out of memory listing %zu micro-tile shapes\n", most);
        rc = 1;
        goto done;
    }
    size_t nshapes = 0;
    for (unsigned th = range[P_THREADS].lo; th <= range[P_THREADS].hi && th <= max_wg; th *= 2)
        for (unsigned v = range[P_VECTOR].lo; v <= range[P_VECTOR].hi; v *= 2) /* the library rejects 2 */
            for (unsigned tm = range[P_TM].lo; tm <= range[P_TM].hi; tm *= 2)
                for (unsigned tn = range[P_TN].lo; tn <= range[P_TN].hi; tn *= 2) {
                    if (th == s1.threads && v == s1.vector && tm == s1.tm && tn == s1.tn)
                        continue;
                    shape_entry *e = &shapes[nshapes];
                    e->t = s1;
                    e->t.threads = th;
                    e->t.vector = v;
                    e->t.tm = tm;
                    e->t.tn = tn;
                    /* the forward and the backward follow; stages 3 and 4 give them their own shapes */
                    e->t.bthreads = e->t.btm = e->t.fthreads = e->t.fdchunk = 0;
                    e->dist = log2_ratio(th, s1.threads) + log2_ratio(v, s1.vector) + log2_ratio(tm, s1.tm) +
                              log2_ratio(tn, s1.tn);
                    e->index = nshapes++;
                }
    if (!opt.quick)
        qsort(shapes, nshapes, sizeof shapes[0], shape_order);
    for (size_t k = 0; k < nshapes; ++k) {
        if (opt.quick && (tu.tried + tu.over + tu.late >= 2 + own_shape ||
                          shapes[k].t.vector != (s1.vector > 1 ? 4u : 1u)))
            continue;
        consider(&tu, &shapes[k].t, CAP_ALL, &best, &best_ms);
    }
    free(shapes);
    /* stage 2: every block x dchunk with the best shape, threads the nearest to the best that fit (within
       --max-tiles where some do) */
    const castle_tuning s2 = best;
    for (unsigned blk = range[P_BLOCK].lo; blk <= range[P_BLOCK].hi && !opt.quick; blk *= 2)
        for (unsigned c = range[P_DCHUNK].lo; c <= range[P_DCHUNK].hi; c *= 2) {
            if (blk == s2.block && c == s2.dchunk)
                continue;
            castle_tuning t = s2, pick = s2;
            t.block = blk;
            t.dchunk = c;
            t.bthreads = t.btm = t.fthreads = t.fdchunk = 0;
            unsigned gap = UINT_MAX; /* the pick's distance from the best's threads, + UINT_MAX / 2 if over the cap */
            for (unsigned th = range[P_THREADS].lo; th <= range[P_THREADS].hi && th <= max_wg; th *= 2) {
                t.threads = th;
                unsigned g = th > s2.threads ? th / s2.threads : s2.threads / th;
                castle_tuning r = {.struct_size = sizeof r};
                if (g >= gap || castle_context_set_tuning(tu.ctx, &t) != CASTLE_SUCCESS ||
                    castle_context_get_tuning(tu.ctx, &r) != CASTLE_SUCCESS)
                    continue;
                if (tiles_per_item(&r) > opt.max_tiles) /* a thread count within the cap comes first */
                    g += UINT_MAX / 2;
                if (g < gap) {
                    gap = g;
                    pick = t;
                }
            }
            if (gap != UINT_MAX)
                consider(&tu, &pick, CAP_ALL, &best, &best_ms);
            else
                ++tu.skipped;
        }
    /* stage 3: the backward's own work-group size and micro-tile rows (bthreads x btm); stage 4: the
       forward's own work-group size and d chunk (fthreads x fdchunk); each under the rest of the best */
    const size_t th_hi = range[P_THREADS].hi < max_wg ? range[P_THREADS].hi : max_wg;
    if (!opt.quick) {
        own_shape_stage(&tu, offsetof(castle_tuning, bthreads), offsetof(castle_tuning, btm),
                        offsetof(castle_tuning, tm), range[P_THREADS].lo, th_hi, range[P_TM].lo, range[P_TM].hi,
                        &best, &best_ms);
        own_shape_stage(&tu, offsetof(castle_tuning, fthreads), offsetof(castle_tuning, fdchunk),
                        offsetof(castle_tuning, dchunk), range[P_THREADS].lo, th_hi, range[P_DCHUNK].lo,
                        range[P_DCHUNK].hi, &best, &best_ms);
    }
    /* then the other staging orders (stage) under the rest of the best tuning */
    const castle_tuning s4 = best;
    for (unsigned sg = range[P_STAGE].lo; sg <= range[P_STAGE].hi && !opt.quick; ++sg) {
        castle_tuning t = s4;
        t.stage = sg;
        if (sg != s4.stage)
            consider(&tu, &t, CAP_ALL, &best, &best_ms);
    }
    /* stage 5, where the device's compiler takes NVIDIA's register cap: the forwards' (fregs), then
       the rest's (regs, the forwards' kept as the best has it: 255 for none), under the rest of the
       best.  Fewer registers, more work-groups resident (groups of 128 work-items in an SM's 65536
       registers: 8 at 64 registers, 7 at 72, 6 at 80, 5 at 96, 4 at 128, 3 at 168), but spills
       where a kernel needs more */
    static const unsigned reg_caps[] = {64, 72, 80, 96, 128, 168};
    const castle_tuning s5 = best;
    for (size_t k = 0; k < sizeof reg_caps / sizeof reg_caps[0] && nv_options && !opt.quick; ++k) {
        castle_tuning t = s5;
        t.fregs = reg_caps[k];
        if (t.fregs != s5.fregs)
            consider(&tu, &t, CAP_ALL, &best, &best_ms);
    }
    const castle_tuning s6 = best;
    for (size_t k = 0; k < sizeof reg_caps / sizeof reg_caps[0] && nv_options && !opt.quick; ++k) {
        castle_tuning t = s6;
        t.regs = reg_caps[k];
        t.fregs = s6.fregs ? s6.fregs : 255;
        if (t.regs != s6.regs)
            consider(&tu, &t, CAP_ALL, &best, &best_ms);
    }
    if (start_ms > 0 && (best_ms < 0 || start_ms <= best_ms)) {
        best = start_run;
        best_ms = start_ms;
    }
    printf("candidates: %d run, %d failed, %d not valid on this device, %d over --max-tiles %u", tu.tried,
           tu.failed, tu.skipped, tu.over, opt.max_tiles);
    if (opt.budget >= 0)
        printf(", %d past --budget %ld s", tu.late, opt.budget);
    printf("\n");
    if (best_ms < 0) {
        fprintf(stderr, "castle-tune: no candidate ran on this device\n");
        rc = 1;
        goto done;
    }
    char bs[256], ss[256];
    castle_tuning_string(&best, bs, sizeof bs);
    castle_tuning_string(&start, ss, sizeof ss);
    printf("best: %s, forward+backward %.3f ms (start %s)\n", bs, best_ms, ss);

    /* verify the winner against the fp64 reference before anyone loads it */
    castle_context_set_tuning(tu.ctx, &best);
    static const h_fwd_case checks[] = {{2, 2, 70, 33, 0, H_BLHD, 1, 0, 5}, {1, 2, 100, 16, 7, H_BHLD, 1, 0, 6}};
    for (size_t k = 0; k < 2; ++k) {
        h_fwd_out out;
        castle_status st = h_run_backward(tu.ctx, tu.q, &checks[k], H_GRAD_EXACT, false, &out);
        double g = 0;
        for (int q = 0; q < 6; ++q)
            g = fmax(g, out.err_grad[q]);
        if (st || !out.guards_ok || !out.finite || out.err_o > FORWARD_TOL || g > BACKWARD_TOL) {
            fprintf(stderr, "castle-tune: the winner fails verification (%s; O error %.3g, gradient error %.3g)\n",
                    st ? castle_last_error() : "wrong result", out.err_o, g);
            rc = 1;
            goto done;
        }
    }
    printf("verified against the fp64 reference: forward and gradients within tolerance\n");
    printf("table entry for host/tuning.c:\n    {\"<name>\", \"%s\", \"%s\", CL_DEVICE_TYPE_ALL, {sizeof(castle_tuning)", vendor,
           name);
#define ENTRY_(field, macro, lo, hi, flags, help) printf(", ." #field " = %u", best.field);
    CASTLE_TUNING_PARAMS(ENTRY_)
#undef ENTRY_
    printf("}},\n");
    if (!opt.dry && (rc = write_entry(path, name, driver, &best)) == 0)
        printf("written to %s\n", path);
    if (tu.failed && !rc) {
        fprintf(stderr, "castle-tune: %d candidate(s) failed to build or run (listed above)\n", tu.failed);
        rc = 1;
    }
done:
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t)
        if (tu.buf[t])
            clReleaseMemObject(tu.buf[t]);
    tool_close_device(tu.ctx);
    return rc;
}
