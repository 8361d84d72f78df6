/* castle-run end to end: the binary (CASTLE_RUN_PATH) is spawned with posix_spawn, its stdout and
 * stderr go to files in a temporary directory and are read back.
 *
 *   forward   inputs written from h_value, outputs compared with the fp64 reference per (b, h)
 *             slice (conformance/tolerance.h measure), for the default, --window and --scale;
 *   --repeat  prints median_ms=<positive> clock=device|host;
 *   random    shape, range, determinism per seed;
 *   errors    malformed .npy inputs (crafted byte by byte here), usage errors (--scale inf, a
 *             malformed --device) and unsupported inputs (head dim 300) exit 2 with a message naming
 *             the problem; library failures (no such device) exit 1, and so does a device buffer
 *             the driver refuses (tests/fail_alloc.c, preloaded), with the buffer's name and size
 *             in the message and nothing written.
 *
 * Everything lives under one mkdtemp() directory that main() creates before the runner forks and
 * removes afterwards, so a failing test leaves nothing behind. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp, posix_spawn, lstat */
#endif
#include "npy.h"
#include "harness.h"
#include "ref.h"
#include "tolerance.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CASTLE_RUN_PATH
#error "CASTLE_RUN_PATH (the path of the castle-run binary, a string) must be defined"
#endif

extern char **environ;

#define PATH_CAP 4096

static char g_root[PATH_CAP]; /* the suite's temporary directory, made by main() */

/* ------------------------------------------------------------------------------------------------ */
/* Files and directories                                                                            */
/* ------------------------------------------------------------------------------------------------ */

static void join(char *dst, const char *dir, const char *name)
{
    const int n = snprintf(dst, PATH_CAP, "%s/%s", dir, name);
    ck_assert_msg(n > 0 && n < PATH_CAP, "path too long: %s/%s", dir, name);
}

static void rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st))
        return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d))) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                    continue;
                char p[PATH_CAP];
                const int n = snprintf(p, sizeof p, "%s/%s", path, e->d_name);
                if (n > 0 && n < PATH_CAP)
                    rm_rf(p);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* A fresh directory under g_root for one test. */
static void new_dir(char *dst)
{
    join(dst, g_root, "tXXXXXX");
    ck_assert_msg(mkdtemp(dst), "mkdtemp(%s): %s", dst, strerror(errno));
}

static void make_dir(char *dst, const char *parent, const char *name)
{
    join(dst, parent, name);
    ck_assert_msg(!mkdir(dst, 0777), "mkdir(%s): %s", dst, strerror(errno));
}

static bool exists(const char *path)
{
    struct stat st;
    return !lstat(path, &st);
}

/* The whole file as a NUL-terminated malloc'd buffer; *len (if given) receives its size. */
static char *read_all(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp, "cannot open %s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    ck_assert(buf);
    for (;;) {
        n += fread(buf + n, 1, cap - n, fp);
        if (n < cap)
            break;
        cap *= 2;
        buf = realloc(buf, cap + 1);
        ck_assert(buf);
    }
    ck_assert_msg(!ferror(fp), "read error on %s", path);
    fclose(fp);
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

static void write_all(const char *path, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_msg(fp, "cannot create %s: %s", path, strerror(errno));
    if (n)
        ck_assert_msg(fwrite(bytes, 1, n, fp) == n, "short write on %s", path);
    ck_assert_msg(!fclose(fp), "close failed on %s", path);
}

/* ------------------------------------------------------------------------------------------------ */
/* Running castle-run                                                                               */
/* ------------------------------------------------------------------------------------------------ */

typedef struct cli_result {
    bool exited;    /* false: killed by a signal (a crash) */
    int code;       /* exit status, or the signal number */
    char *out, *err; /* its stdout and stderr */
} cli_result;

static void cli_free(cli_result *r)
{
    free(r->out);
    free(r->err);
    memset(r, 0, sizeof *r);
}

/* This process's environment with the NULL-terminated "NAME=value" entries of extra added, each
   replacing a variable of the same name; a malloc'd array of pointers into environ and extra. */
static char **environ_with(const char *const *extra)
{
    size_t n = 0, k = 0;
    while (environ[n])
        ++n;
    while (extra && extra[k])
        ++k;
    char **env = malloc((n + k + 1) * sizeof *env);
    ck_assert(env);
    size_t m = 0;
    for (size_t i = 0; i < n; ++i) {
        bool replaced = false;
        for (size_t j = 0; j < k && !replaced; ++j) {
            const char *eq = strchr(extra[j], '=');
            ck_assert_msg(eq, "environment entry without '=': %s", extra[j]);
            replaced = !strncmp(environ[i], extra[j], (size_t)(eq - extra[j]) + 1);
        }
        if (!replaced)
            env[m++] = environ[i];
    }
    for (size_t j = 0; j < k; ++j)
        env[m++] = (char *)extra[j];
    env[m] = NULL;
    return env;
}

/* Runs castle-run with the NULL-terminated argument list and this environment plus extra_env
   (environ_with; NULL: none); stdin is /dev/null, stdout and stderr go to files in logdir and are
   read back into r. */
static void cli_runve(cli_result *r, const char *logdir, const char *const *args, const char *const *extra_env)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)CASTLE_RUN_PATH;
    for (; args[argc - 1]; ++argc) {
        ck_assert(argc < 31);
        argv[argc] = (char *)args[argc - 1];
    }
    argv[argc] = NULL;

    char out_path[PATH_CAP], err_path[PATH_CAP];
    join(out_path, logdir, "cli_stdout.txt");
    join(err_path, logdir, "cli_stderr.txt");
    posix_spawn_file_actions_t fa;
    ck_assert(!posix_spawn_file_actions_init(&fa));
    ck_assert(!posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0));
    ck_assert(!posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    ck_assert(!posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    char **env = environ_with(extra_env);
    pid_t pid;
    const int e = posix_spawn(&pid, CASTLE_RUN_PATH, &fa, NULL, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    ck_assert_msg(!e, "cannot start %s: %s", CASTLE_RUN_PATH, strerror(e));
    int status;
    pid_t w;
    while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    ck_assert_msg(w == pid, "waitpid: %s", strerror(errno));
    memset(r, 0, sizeof *r);
    r->exited = WIFEXITED(status);
    r->code = r->exited ? WEXITSTATUS(status) : WIFSIGNALED(status) ? WTERMSIG(status) : -1;
    r->out = read_all(out_path, NULL);
    r->err = read_all(err_path, NULL);
    ck_assert_msg(r->exited, "castle-run did not exit normally (signal %d); stderr:\n%s", r->code, r->err);
}

static void cli_runv(cli_result *r, const char *logdir, const char *const *args) { cli_runve(r, logdir, args, NULL); }

#define CLI(r, logdir, ...) cli_runv((r), (logdir), (const char *const[]){__VA_ARGS__, NULL})

/* Asserts the exit status and (when phrase is set) that stderr contains phrase. */
static void expect(const cli_result *r, int code, const char *phrase, const char *what)
{
    ck_assert_msg(r->code == code, "%s: exit status %d, expected %d; stderr:\n%s", what, r->code, code, r->err);
    if (phrase)
        ck_assert_msg(strstr(r->err, phrase), "%s: stderr lacks \"%s\":\n%s", what, phrase, r->err);
}

/* ------------------------------------------------------------------------------------------------ */
/* Inputs                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

static const char *const names[6] = {"qu", "ku", "vu", "qc", "kc", "vc"};

/* The tensors h_value(seed, t, b, h, r, c) as float, (6, B, H, L, d) C order, malloc'd. */
static float *make_values(uint64_t seed, const size_t shape[4])
{
    const size_t n = shape[0] * shape[1] * shape[2] * shape[3];
    float *v = malloc(6 * n * sizeof(float));
    ck_assert(v);
    size_t i = 0;
    for (unsigned t = 0; t < 6; ++t)
        for (size_t b = 0; b < shape[0]; ++b)
            for (size_t h = 0; h < shape[1]; ++h)
                for (size_t r = 0; r < shape[2]; ++r)
                    for (size_t c = 0; c < shape[3]; ++c)
                        v[i++] = (float)h_value(seed, t, b, h, r, c);
    return v;
}

static void write_npy(const char *dir, const char *name, const float *data, int ndim, const size_t *shape)
{
    char path[PATH_CAP], file[64], err[512];
    snprintf(file, sizeof file, "%s.npy", name);
    join(path, dir, file);
    ck_assert_msg(!npy_write_f32(path, data, ndim, shape, err, sizeof err), "%s", err);
}

/* Writes the six inputs of the given shape to dir; returns the values (make_values layout). */
static float *write_inputs(const char *dir, uint64_t seed, const size_t shape[4])
{
    float *v = make_values(seed, shape);
    const size_t n = shape[0] * shape[1] * shape[2] * shape[3];
    for (int t = 0; t < 6; ++t)
        write_npy(dir, names[t], v + (size_t)t * n, 4, shape);
    return v;
}

static void read_npy(const char *path, npy_array *a)
{
    char err[512];
    ck_assert_msg(!npy_read_f32(path, a, err, sizeof err), "%s", err);
}

/* A .npy file assembled byte by byte: the magic, version 1.0, a little-endian uint16 header length
   (hlen_field, or the real length when 0), `dict` padded with spaces to a 64-byte boundary and
   ended by '\n', then `payload` as given. */
static void write_raw_npy(const char *path, const char *dict, unsigned hlen_field, const void *payload, size_t nbytes)
{
    const size_t dlen = strlen(dict);
    size_t total = 10 + dlen + 1;
    total += (64 - total % 64) % 64;
    const size_t hlen = total - 10;
    unsigned char *buf = malloc(total + nbytes);
    ck_assert(buf);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = 1;
    buf[7] = 0;
    if (!hlen_field)
        hlen_field = (unsigned)hlen;
    buf[8] = (unsigned char)(hlen_field & 0xff);
    buf[9] = (unsigned char)(hlen_field >> 8);
    memcpy(buf + 10, dict, dlen);
    memset(buf + 10 + dlen, ' ', hlen - dlen - 1);
    buf[total - 1] = '\n';
    if (nbytes)
        memcpy(buf + total, payload, nbytes);
    write_all(path, buf, total + nbytes);
    free(buf);
}

/* count little-endian float32 (f8: float64) values 0.5, 0.25, -0.5, ... */
static unsigned char *le_values(size_t count, bool f8)
{
    unsigned char *p = malloc(count * 8 + 1);
    ck_assert(p);
    for (size_t i = 0; i < count; ++i) {
        const double x = ((double)(i % 7) - 3.0) / 8.0;
        if (f8) {
            uint64_t u;
            memcpy(&u, &x, 8);
            for (int k = 0; k < 8; ++k)
                p[8 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
        } else {
            const float f = (float)x;
            uint32_t u;
            memcpy(&u, &f, 4);
            for (int k = 0; k < 4; ++k)
                p[4 * i + (size_t)k] = (unsigned char)(u >> (8 * k));
        }
    }
    return p;
}

/* ------------------------------------------------------------------------------------------------ */
/* forward: correctness against the fp64 reference                                                  */
/* ------------------------------------------------------------------------------------------------ */

typedef struct fwd_variant {
    const char *opt, *val; /* the extra option, or NULL */
    long W;
    double scale; /* 0 = 1/sqrt(d) */
    bool differs; /* the option changes the result (checked against the default reference) */
} fwd_variant;

static const fwd_variant variants[] = {
    {NULL, NULL, 0, 0, false},
    {"--window", "5", 5, 0, true},
    /* with d = 16 the default scale is 1/sqrt(16) = 0.25 too: this one checks the option is accepted
       and honoured exactly, --scale 0.4 checks that it is actually passed on */
    {"--scale", "0.25", 0, 0.25, false},
    {"--scale", "0.4", 0, 0.4, true},
};

/* Per (b, h) slice: max |got - ref| / max(1, max |ref|) (conformance/tolerance.h), the worst slice. */
static double worst_slice_err(const float *got, const double *ref, size_t slices, size_t len, bool *finite)
{
    double worst = 0;
    for (size_t s = 0; s < slices; ++s) {
        double e = 0, m = 1;
        for (size_t i = s * len; i < (s + 1) * len; ++i) {
            if (!isfinite(got[i]))
                *finite = false;
            e = fmax(e, fabs((double)got[i] - ref[i]));
            m = fmax(m, fabs(ref[i]));
        }
        worst = fmax(worst, e / m);
    }
    return worst;
}

/* The fp64 reference for all (b, h) slices of the make_values inputs. */
static void reference(const float *v, const size_t shape[4], long W, double sc, double *ro, double *rl)
{
    const size_t L = shape[2], d = shape[3], bhs = shape[0] * shape[1], n = bhs * L * d;
    double *in = malloc(6 * L * d * sizeof(double));
    ck_assert(in);
    for (size_t bh = 0; bh < bhs; ++bh) {
        for (size_t t = 0; t < 6; ++t)
            for (size_t i = 0; i < L * d; ++i)
                in[t * L * d + i] = (double)v[t * n + bh * L * d + i];
        ck_assert(!ref_forward_recurrent((int)L, (int)d, (int)W, sc, in, in + L * d, in + 2 * L * d, in + 3 * L * d,
                                         in + 4 * L * d, in + 5 * L * d, ro + bh * L * d, rl + bh * L));
    }
    free(in);
}

START_TEST(test_forward_matches_reference)
{
    const fwd_variant *var = &variants[_i];
    const char *what = var->opt ? var->opt : "default";
    const size_t shape[4] = {2, 3, 70, 16};
    const size_t L = shape[2], d = shape[3], nl = shape[0] * shape[1] * L, n = nl * d;
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP], path[PATH_CAP];
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out"); /* castle-run creates it */
    float *v = write_inputs(in, 20 + (uint64_t)_i, shape);

    cli_result r;
    if (var->opt)
        CLI(&r, dir, "forward", "--in", in, "--out", out, var->opt, var->val);
    else
        CLI(&r, dir, "forward", "--in", in, "--out", out);
    expect(&r, 0, NULL, what);
    cli_free(&r);

    npy_array o, lse;
    join(path, out, "o.npy");
    read_npy(path, &o);
    join(path, out, "lse.npy");
    read_npy(path, &lse);
    ck_assert_msg(o.ndim == 4 && !memcmp(o.shape, shape, sizeof shape), "o.npy has shape (%zu, %zu, %zu, %zu) ndim %d",
                  o.shape[0], o.shape[1], o.shape[2], o.shape[3], o.ndim);
    ck_assert_msg(lse.ndim == 3 && !memcmp(lse.shape, shape, 3 * sizeof(size_t)),
                  "lse.npy has shape (%zu, %zu, %zu) ndim %d", lse.shape[0], lse.shape[1], lse.shape[2], lse.ndim);

    double *ro = malloc(n * sizeof(double)), *rl = malloc(nl * sizeof(double));
    ck_assert(ro && rl);
    const double sc = var->scale ? (double)(float)var->scale : 1.0 / sqrt((double)d);
    reference(v, shape, var->W, sc, ro, rl);
    bool finite = true;
    const double eo = worst_slice_err(o.data, ro, nl / L, L * d, &finite);
    const double el = worst_slice_err(lse.data, rl, nl / L, L, &finite);
    ck_assert_msg(finite, "%s: non-finite output", what);
    ck_assert_msg(eo <= FORWARD_TOL && el <= FORWARD_TOL, "%s: err_o=%.3g err_lse=%.3g > tol %.3g", what, eo, el,
                  FORWARD_TOL);

    if (var->differs) { /* the option reached the library: the default reference no longer fits */
        reference(v, shape, 0, 1.0 / sqrt((double)d), ro, rl);
        const double e0 = worst_slice_err(o.data, ro, nl / L, L * d, &finite);
        ck_assert_msg(e0 > 1e-3, "%s: output matches the default-options reference (err %.3g)", what, e0);
    }
    free(ro);
    free(rl);
    npy_free(&o);
    npy_free(&lse);
    free(v);
}
END_TEST

START_TEST(test_repeat_prints_median)
{
    const size_t shape[4] = {1, 2, 40, 8};
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP], path[PATH_CAP];
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out");
    free(write_inputs(in, 5, shape));
    cli_result r;
    CLI(&r, dir, "forward", "--in", in, "--out", out, "--repeat", "3");
    expect(&r, 0, NULL, "--repeat 3");
    const char *p = r.out;
    while ((p = strstr(p, "median_ms=")) && p != r.out && p[-1] != '\n')
        ++p;
    ck_assert_msg(p, "stdout has no line median_ms=...:\n%s", r.out);
    char *end;
    const double ms = strtod(p + strlen("median_ms="), &end);
    ck_assert_msg(end != p + strlen("median_ms=") &&
                      (!strncmp(end, " clock=device\n", 14) || !strncmp(end, " clock=host\n", 12)),
                  "malformed line in stdout (expected median_ms=<ms> clock=device|host):\n%s", r.out);
    /* positive on either clock: a device whose profiling times are zero falls back to the host's */
    ck_assert_msg(isfinite(ms) && ms > 0, "median_ms=%g is not a positive number", ms);
    join(path, out, "o.npy");
    ck_assert_msg(exists(path), "--repeat run wrote no o.npy");
    cli_free(&r);
}
END_TEST

/* backward: the six gradients of sum(dO * O) against the fp64 reference (conformance/tolerance.h). */
START_TEST(test_backward_matches_reference)
{
    const size_t shape[4] = {1, 2, 45, 8};
    const size_t L = shape[2], d = shape[3], bhs = shape[0] * shape[1], n = bhs * L * d;
    const long W = _i ? 3 : 0;
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP], path[PATH_CAP];
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out");
    float *v = write_inputs(in, 61, shape);
    float *dov = malloc(n * sizeof(float));
    ck_assert(dov);
    for (size_t bh = 0, i = 0; bh < bhs; ++bh)
        for (size_t r = 0; r < L; ++r)
            for (size_t c = 0; c < d; ++c)
                dov[i++] = (float)h_value(62, 6, 0, bh, r, c);
    cli_result r;
    CLI(&r, dir, "backward", "--in", in, "--out", out, "--window", W ? "3" : "0");
    expect(&r, 2, "do.npy", "backward without do.npy");
    cli_free(&r);
    write_npy(in, "do", dov, 4, shape);
    CLI(&r, dir, "backward", "--in", in, "--out", out, "--window", W ? "3" : "0");
    expect(&r, 0, NULL, "backward");
    cli_free(&r);

    static const char *const gnames[6] = {"dqu", "dku", "dvu", "dqc", "dkc", "dvc"};
    double *in64 = malloc(7 * L * d * sizeof(double)), *ref = malloc(6 * n * sizeof(double));
    ck_assert(in64 && ref);
    const double sc = 1.0 / sqrt((double)d);
    for (size_t bh = 0; bh < bhs; ++bh) {
        for (size_t t = 0; t < 7; ++t)
            for (size_t i = 0; i < L * d; ++i)
                in64[t * L * d + i] = t < 6 ? (double)v[t * n + bh * L * d + i] : (double)dov[bh * L * d + i];
        double *g[6];
        for (int k = 0; k < 6; ++k)
            g[k] = ref + (size_t)k * n + bh * L * d;
        ck_assert(!ref_backward((int)L, (int)d, (int)W, sc, in64, in64 + L * d, in64 + 2 * L * d, in64 + 3 * L * d,
                                in64 + 4 * L * d, in64 + 5 * L * d, in64 + 6 * L * d, g[0], g[1], g[2], g[3], g[4],
                                g[5]));
    }
    for (int k = 0; k < 6; ++k) {
        char file[32];
        snprintf(file, sizeof file, "%s.npy", gnames[k]);
        join(path, out, file);
        npy_array a;
        read_npy(path, &a);
        ck_assert_msg(a.ndim == 4 && !memcmp(a.shape, shape, sizeof shape), "%s has the wrong shape", file);
        double e = 0, m = 1e-3; /* the gradient measure of conformance/tolerance.h */
        for (size_t i = 0; i < n; ++i) {
            ck_assert_msg(isfinite(a.data[i]), "%s: non-finite entry", file);
            e = fmax(e, fabs((double)a.data[i] - ref[(size_t)k * n + i]));
            m = fmax(m, fabs(ref[(size_t)k * n + i]));
        }
        ck_assert_msg(e / m <= BACKWARD_TOL, "%s (W=%ld): error %.3g > %.3g", file, W, e / m, BACKWARD_TOL);
        npy_free(&a);
    }
    CLI(&r, dir, "backward", "--in", in, "--out", out, "--repeat", "2");
    expect(&r, 0, NULL, "backward --repeat 2");
    ck_assert_msg(strstr(r.out, "median_ms="), "backward --repeat printed no median_ms:\n%s", r.out);
    cli_free(&r);
    free(in64);
    free(ref);
    free(dov);
    free(v);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ */
/* random                                                                                           */
/* ------------------------------------------------------------------------------------------------ */

static void run_random(const char *logdir, const char *out, const char *seed)
{
    cli_result r;
    CLI(&r, logdir, "random", "--shape", "1,2,9,4", "--out", out, "--seed", seed);
    expect(&r, 0, NULL, "random");
    ck_assert_msg(!r.err[0], "random printed on stderr:\n%s", r.err);
    cli_free(&r);
}

/* Checks dir holds the six inputs of shape (1, 2, 9, 4) with values in [-1, 1). */
static void check_random_dir(const char *dir)
{
    static const size_t shape[4] = {1, 2, 9, 4};
    for (int t = 0; t < 6; ++t) {
        char path[PATH_CAP], file[16];
        snprintf(file, sizeof file, "%s.npy", names[t]);
        join(path, dir, file);
        npy_array a;
        read_npy(path, &a);
        ck_assert_msg(a.ndim == 4 && !memcmp(a.shape, shape, sizeof shape) && a.count == 72,
                      "%s: shape (%zu, %zu, %zu, %zu) ndim %d", path, a.shape[0], a.shape[1], a.shape[2], a.shape[3],
                      a.ndim);
        for (size_t i = 0; i < a.count; ++i)
            ck_assert_msg(a.data[i] >= -1.0f && a.data[i] < 1.0f, "%s[%zu] = %.9g outside [-1, 1)", path, i,
                          (double)a.data[i]);
        npy_free(&a);
    }
}

static bool same_file(const char *a_dir, const char *b_dir, const char *name)
{
    char pa[PATH_CAP], pb[PATH_CAP], file[16];
    snprintf(file, sizeof file, "%s.npy", name);
    join(pa, a_dir, file);
    join(pb, b_dir, file);
    size_t na, nb;
    char *a = read_all(pa, &na), *b = read_all(pb, &nb);
    const bool same = na == nb && !memcmp(a, b, na);
    free(a);
    free(b);
    return same;
}

START_TEST(test_random_files)
{
    char dir[PATH_CAP], a[PATH_CAP], b[PATH_CAP], c[PATH_CAP];
    new_dir(dir);
    join(a, dir, "a");
    join(b, dir, "b");
    join(c, dir, "c");
    run_random(dir, a, "3");
    run_random(dir, b, "3");
    run_random(dir, c, "4");
    check_random_dir(a);
    check_random_dir(c);
    for (int t = 0; t < 6; ++t) {
        ck_assert_msg(same_file(a, b, names[t]), "%s.npy differs between two runs with --seed 3", names[t]);
        ck_assert_msg(!same_file(a, c, names[t]), "%s.npy is the same for --seed 3 and --seed 4", names[t]);
    }
}
END_TEST

/* Neighbouring seeds must give unrelated data, not the same stream moved by one element. */
START_TEST(test_random_seeds_independent)
{
    char dir[PATH_CAP], a[PATH_CAP], c[PATH_CAP], path[PATH_CAP];
    new_dir(dir);
    join(a, dir, "a");
    join(c, dir, "c");
    run_random(dir, a, "3");
    run_random(dir, c, "4");
    npy_array x, y;
    join(path, a, "qu.npy");
    read_npy(path, &x);
    join(path, c, "qu.npy");
    read_npy(path, &y);
    size_t shifted = 0;
    for (size_t i = 0; i + 1 < x.count; ++i)
        shifted += x.data[i + 1] == y.data[i];
    ck_assert_msg(shifted < 4, "qu.npy of --seed 4 is qu.npy of --seed 3 shifted by one element (%zu of %zu equal)",
                  shifted, x.count - 1);
    npy_free(&x);
    npy_free(&y);
}
END_TEST

/* The documented range is [-1, 1): a double just below 1 must not round to 1.0f.  With the
   generator of castle-run at the time of writing, seed 14889097 makes qu[0] = 1.0f (found by
   replaying its splitmix64 stream). */
START_TEST(test_random_range_edge)
{
    char dir[PATH_CAP], a[PATH_CAP];
    new_dir(dir);
    join(a, dir, "a");
    run_random(dir, a, "14889097");
    check_random_dir(a);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ */
/* Malformed inputs: exit status 2, a message naming the file and the problem                       */
/* ------------------------------------------------------------------------------------------------ */

#define F4_4D "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 5, 4), }"

typedef enum bad_kind {
    BAD_NONE, /* control: a crafted but valid qu.npy */
    BAD_F8,
    BAD_FORTRAN,
    BAD_SHAPE_MISMATCH,
    BAD_3D,
    BAD_TRUNCATED,
    BAD_HLEN_LIES,
    BAD_MISSING,
    BAD_NOT_NPY,
    BAD_TRAILING,
} bad_kind;

typedef struct bad_case {
    bad_kind kind;
    const char *what;
    const char *file;   /* the file the message must name */
    const char *phrase; /* what it must say */
} bad_case;

static const bad_case bad_cases[] = {
    {BAD_NONE, "crafted valid qu.npy", NULL, NULL},
    {BAD_F8, "float64 dtype", "qu.npy", "'<f8' is not supported"},
    {BAD_FORTRAN, "Fortran order", "qu.npy", "Fortran order not supported"},
    {BAD_SHAPE_MISMATCH, "kc.npy with another L", "kc.npy", "disagrees with qu.npy"},
    {BAD_3D, "3-D array", "qu.npy", "expected 4 dimensions"},
    {BAD_TRUNCATED, "truncated data", "qu.npy", "truncated"},
    {BAD_HLEN_LIES, "header length beyond the file", "qu.npy", "exceeds file size"},
    {BAD_MISSING, "missing qu.npy", "qu.npy", "cannot open file"},
    {BAD_NOT_NPY, "text file", "qu.npy", "not a NumPy .npy file"},
    {BAD_TRAILING, "bytes after the data", "qu.npy", "header disagrees with file size"},
};
#define NBAD ((int)(sizeof bad_cases / sizeof bad_cases[0]))

START_TEST(test_malformed_input)
{
    const bad_case *bc = &bad_cases[_i];
    static const size_t shape[4] = {1, 2, 5, 4};
    const size_t count = 40;
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP], qu[PATH_CAP], path[PATH_CAP];
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out");
    free(write_inputs(in, 9, shape));
    join(qu, in, "qu.npy");
    unsigned char *f4 = le_values(count + 1, false), *f8 = le_values(count, true);
    switch (bc->kind) {
    case BAD_NONE:
        write_raw_npy(qu, F4_4D, 0, f4, 4 * count);
        break;
    case BAD_F8:
        write_raw_npy(qu, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 5, 4), }", 0, f8, 8 * count);
        break;
    case BAD_FORTRAN:
        write_raw_npy(qu, "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2, 5, 4), }", 0, f4, 4 * count);
        break;
    case BAD_SHAPE_MISMATCH: {
        const size_t other[4] = {1, 2, 6, 4};
        float *v = make_values(9, other);
        write_npy(in, "kc", v, 4, other);
        free(v);
        break;
    }
    case BAD_3D:
        write_raw_npy(qu, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 5, 4), }", 0, f4, 4 * count);
        break;
    case BAD_TRUNCATED:
        write_raw_npy(qu, F4_4D, 0, f4, 4 * count - 10);
        break;
    case BAD_HLEN_LIES: /* the file is 64 + 160 bytes; the header claims 65520 */
        write_raw_npy(qu, F4_4D, 0xfff0, f4, 4 * count);
        break;
    case BAD_MISSING:
        ck_assert(!unlink(qu));
        break;
    case BAD_NOT_NPY: {
        static const char text[] = "B,H,L,d\n1,2,5,4\nthis is a CSV file, not .npy\n";
        write_all(qu, text, sizeof text - 1);
        break;
    }
    case BAD_TRAILING:
        write_raw_npy(qu, F4_4D, 0, f4, 4 * count + 4);
        break;
    }
    free(f4);
    free(f8);

    cli_result r;
    CLI(&r, dir, "forward", "--in", in, "--out", out);
    join(path, out, "o.npy");
    if (bc->kind == BAD_NONE) {
        expect(&r, 0, NULL, bc->what);
        ck_assert_msg(exists(path), "%s: no o.npy written", bc->what);
    } else {
        expect(&r, 2, bc->phrase, bc->what);
        expect(&r, 2, bc->file, bc->what);
        expect(&r, 2, "castle-run: ", bc->what);
        ck_assert_msg(!exists(path), "%s: o.npy written despite the error", bc->what);
    }
    cli_free(&r);
}
END_TEST

/* ------------------------------------------------------------------------------------------------ */
/* Usage errors: exit status 2, a message naming the problem, nothing run                            */
/* ------------------------------------------------------------------------------------------------ */

enum { MAX_ARGS = 10 };
typedef struct usage_case {
    const char *what;
    const char *phrase;
    const char *args[MAX_ARGS]; /* "@in" / "@out" stand for a valid input directory / a fresh output one */
} usage_case;

static const usage_case usage_cases[] = {
    {"no command", "missing command", {NULL}},
    {"unknown command", "unknown command 'sideways'", {"sideways", "--in", "@in", "--out", "@out"}},
    {"unknown option", "unknown option '--bogus'", {"forward", "--in", "@in", "--out", "@out", "--bogus", "1"}},
    {"missing --in", "--in DIR is required", {"forward", "--out", "@out"}},
    {"missing --out", "--out DIR is required", {"forward", "--in", "@in"}},
    {"--window -1", "--window needs an integer >= 0", {"forward", "--in", "@in", "--out", "@out", "--window", "-1"}},
    {"--repeat 0", "--repeat needs an integer in 1..100000", {"forward", "--in", "@in", "--out", "@out", "--repeat", "0"}},
    {"--scale -1", "--scale needs 0 (1/sqrt(d)) or a float32 number in (0, 65536]", {"forward", "--in", "@in", "--out", "@out", "--scale", "-1"}},
    {"--scale inf", "--scale needs 0 (1/sqrt(d)) or a float32", {"forward", "--in", "@in", "--out", "@out", "--scale", "inf"}},
    {"--scale nan", "--scale needs 0 (1/sqrt(d)) or a float32", {"forward", "--in", "@in", "--out", "@out", "--scale", "nan"}},
    /* above CASTLE_MAX_SCALE, which the library would reject: bad usage too */
    {"--scale 1e6", "--scale needs 0 (1/sqrt(d)) or a float32", {"forward", "--in", "@in", "--out", "@out", "--scale", "1e6"}},
    /* positive, but 0 as a float: it must not silently mean 1/sqrt(d) */
    {"--scale 1e-50", "--scale needs 0 (1/sqrt(d)) or a float32", {"backward", "--in", "@in", "--out", "@out", "--scale", "1e-50"}},
    {"--device 1:x", "--device needs P:D", {"forward", "--in", "@in", "--out", "@out", "--device", "1:x"}},
    {"--device -1", "--device needs P:D", {"decode", "--in", "@in", "--out", "@out", "--prompt", "1", "--device", "-1"}},
    {"a stray argument", "unexpected argument 'stray'", {"forward", "--in", "@in", "--out", "@out", "stray"}},
    {"option without its value", "option '--window' needs a value", {"forward", "--in", "@in", "--out", "@out", "--window"}},
    {"--shape 1,2,3", "--shape needs four positive integers", {"random", "--shape", "1,2,3", "--out", "@out"}},
    {"--shape with a zero", "--shape needs four positive integers", {"random", "--shape", "1,0,3,4", "--out", "@out"}},
    /* a negative size wrapped and was called too large; a d no operation takes was written */
    {"--shape with a negative", "--shape needs four positive integers", {"random", "--shape", "1,-2,3,4", "--out", "@out"}},
    {"--shape with d 257", "--shape's d must be in 1..256", {"random", "--shape", "1,2,3,257", "--out", "@out"}},
    {"random without --shape", "random needs --shape", {"random", "--out", "@out"}},
    {"--seed x", "--seed needs a non-negative integer", {"random", "--shape", "1,1,1,1", "--out", "@out", "--seed", "x"}},
    /* an option of another command: refused, not ignored (they ran, exit 0) */
    {"--prompt to random", "option '--prompt' does not apply to random", {"random", "--shape", "1,1,1,1", "--out", "@out", "--prompt", "3"}},
    {"--device to random", "option '--device' does not apply to random", {"random", "--shape", "1,1,1,1", "--out", "@out", "--device", "0:0"}},
    {"--seed to forward", "option '--seed' does not apply to forward", {"forward", "--in", "@in", "--out", "@out", "--seed", "9"}},
    {"--chunk to backward", "option '--chunk' does not apply to backward", {"backward", "--in", "@in", "--out", "@out", "--chunk", "2"}},
    {"--shape to decode", "option '--shape' does not apply to decode", {"decode", "--in", "@in", "--out", "@out", "--prompt", "1", "--shape", "1,1,1,1"}},
};
#define NUSAGE ((int)(sizeof usage_cases / sizeof usage_cases[0]))

/* Runs args with @in / @out substituted; returns with r filled and out set to the output dir. */
static void run_subst(cli_result *r, const char *dir, const char *const *args, char *out)
{
    char in[PATH_CAP];
    make_dir(in, dir, "in");
    join(out, dir, "out");
    free(write_inputs(in, 4, (const size_t[4]){1, 1, 3, 4}));
    const char *argv[MAX_ARGS + 1];
    int n = 0;
    for (; n < MAX_ARGS && args[n]; ++n)
        argv[n] = !strcmp(args[n], "@in") ? in : !strcmp(args[n], "@out") ? out : args[n];
    argv[n] = NULL;
    cli_runv(r, dir, argv);
}

START_TEST(test_usage_error)
{
    const usage_case *uc = &usage_cases[_i];
    char dir[PATH_CAP], out[PATH_CAP];
    new_dir(dir);
    cli_result r;
    run_subst(&r, dir, uc->args, out);
    expect(&r, 2, uc->phrase, uc->what);
    expect(&r, 2, "--help", uc->what); /* points at the usage text */
    ck_assert_msg(!exists(out), "%s: the output directory was created", uc->what);
    cli_free(&r);
}
END_TEST

/* An unknown option as the last argument is an unknown option, not an option lacking its value. */
START_TEST(test_unknown_last_option)
{
    char dir[PATH_CAP], out[PATH_CAP];
    new_dir(dir);
    cli_result r;
    run_subst(&r, dir, (const char *const[]){"forward", "--in", "@in", "--out", "@out", "--bogus", NULL}, out);
    expect(&r, 2, "unknown option '--bogus'", "trailing unknown option");
    cli_free(&r);
}
END_TEST

START_TEST(test_help)
{
    static const char *const forms[][2] = {{"--help", NULL}, {"-h", NULL}, {"forward", "--help"}, {"random", "-h"}};
    char dir[PATH_CAP];
    new_dir(dir);
    for (size_t f = 0; f < sizeof forms / sizeof forms[0]; ++f) {
        cli_result r;
        cli_runv(&r, dir, (const char *const[]){forms[f][0], forms[f][1], NULL});
        expect(&r, 0, NULL, forms[f][0]);
        ck_assert_msg(!strncmp(r.out, "usage:", 6), "%s %s: stdout does not start with usage:\n%s", forms[f][0],
                      forms[f][1] ? forms[f][1] : "", r.out);
        ck_assert_msg(strstr(r.out, "castle-run forward") && strstr(r.out, "castle-run random"),
                      "the usage text lacks a command:\n%s", r.out);
        ck_assert_msg(!r.err[0], "--help printed on stderr:\n%s", r.err);
        cli_free(&r);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------------ */
/* Library failures: exit status 1                                                                  */
/* ------------------------------------------------------------------------------------------------ */

START_TEST(test_head_dim_too_large)
{
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP];
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out");
    free(write_inputs(in, 6, (const size_t[4]){1, 1, 3, 300}));
    cli_result r;
    CLI(&r, dir, "forward", "--in", in, "--out", out);
    expect(&r, 2, "head dim d = 300", "head dim 300");
    expect(&r, 2, "1..256", "head dim 300");
    cli_free(&r);
}
END_TEST

START_TEST(test_no_such_device)
{
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP];
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out");
    free(write_inputs(in, 6, (const size_t[4]){1, 1, 3, 4}));
    cli_result r;
    CLI(&r, dir, "forward", "--in", in, "--out", out, "--device", "99:0");
    expect(&r, 1, "99:0", "--device 99:0");
    expect(&r, 1, "device", "--device 99:0");
    cli_free(&r);
}
END_TEST

/* A kernel that does not compile (CASTLE_CL_DIR holding a broken forward.cl beside empty common.cl and
   local_memory.h): castle-run exits 1 and prints the compiler's log, whose messages name the file
   and line (host/program.c's #line directives), and writes nothing. */
START_TEST(test_build_failure_log)
{
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP], cl[PATH_CAP], path[PATH_CAP];
    new_dir(dir);
    make_dir(in, dir, "in");
    make_dir(cl, dir, "cl");
    join(out, dir, "out");
    free(write_inputs(in, 6, (const size_t[4]){1, 1, 3, 4}));
    join(path, cl, "common.cl");
    write_all(path, "", 0);
    join(path, cl, "local_memory.h");
    write_all(path, "", 0);
    join(path, cl, "forward.cl");
    static const char broken[] = "/* line 1 */\nthis is not OpenCL;\n";
    write_all(path, broken, sizeof broken - 1);
    char e_dir[PATH_CAP + 16];
    snprintf(e_dir, sizeof e_dir, "CASTLE_CL_DIR=%s", cl);
    cli_result r;
    cli_runve(&r, dir, (const char *const[]){"forward", "--in", in, "--out", out, NULL},
              (const char *const[]){e_dir, "CASTLE_CACHE_DIR=off", NULL});
    expect(&r, 1, "CASTLE_ERR_BUILD_FAILED", "a broken forward.cl");
    expect(&r, 1, "build log", "a broken forward.cl");
    expect(&r, 1, "forward.cl:2:", "a broken forward.cl");
    ck_assert_msg(!exists(out), "a failed build created the output directory");
    cli_free(&r);
}
END_TEST

/* A device buffer the driver refuses: castle-run exits 1 naming the buffer and its size, and writes
   nothing.  No device refuses an allocation cheaply, so tests/fail_alloc.c is preloaded: it makes
   clCreateBuffer fail (CL_MEM_OBJECT_ALLOCATION_FAILURE) for CASTLE_TEST_FAIL_BUFFER_BYTES bytes and
   more.  castle-run allocates the tensors (qu first), then the workspace, which is larger than any
   tensor: a threshold of one tensor's bytes fails qu, one byte more fails the workspace.  The sizes
   expected come from the shape and from castle_forward_workspace_size on the same device.  Under
   ASan (the asan tier) the preloaded module comes before the ASan runtime in the library list, which
   ASan refuses unless verify_asan_link_order=0; the module interposes nothing of ASan's. */
typedef struct alloc_case {
    const char *cmd;
    bool workspace; /* the threshold fails the workspace (else qu) */
} alloc_case;

static const alloc_case alloc_cases[] = {
    {"forward", false}, {"forward", true}, {"backward", false}, {"backward", true}};

/* castle-run cmd --in in --out out with tests/fail_alloc.c preloaded, told what to fail by `what`
   (an environment assignment). */
static void run_failing(cli_result *r, const char *dir, const char *cmd, const char *in, const char *out,
                        const char *what)
{
    const char *asan = getenv("ASAN_OPTIONS"), *preload = getenv("LD_PRELOAD");
    char e_preload[PATH_CAP], e_asan[PATH_CAP];
    int n = snprintf(e_preload, sizeof e_preload, "LD_PRELOAD=%s%s%s", CASTLE_FAIL_ALLOC_PATH,
                     preload && preload[0] ? ":" : "", preload ? preload : "");
    ck_assert(n > 0 && n < (int)sizeof e_preload);
    n = snprintf(e_asan, sizeof e_asan, "ASAN_OPTIONS=%s%sverify_asan_link_order=0", asan ? asan : "",
                 asan && asan[0] ? ":" : "");
    ck_assert(n > 0 && n < (int)sizeof e_asan);
    cli_runve(r, dir, (const char *const[]){cmd, "--in", in, "--out", out, NULL},
              (const char *const[]){what, e_preload, e_asan, NULL});
}

static void run_preloaded(cli_result *r, const char *dir, const char *cmd, const char *in, const char *out,
                          unsigned long long fail_bytes)
{
    char e_bytes[64];
    snprintf(e_bytes, sizeof e_bytes, "CASTLE_TEST_FAIL_BUFFER_BYTES=%llu", fail_bytes);
    run_failing(r, dir, cmd, in, out, e_bytes);
}

/* OpenCL failing to list its platforms or a platform's devices after counting them, or to say the
   device's local memory (tests/fail_alloc.c, CASTLE_TEST_FAIL_LISTING): castle-run exits 1 with the
   library's message naming the call, and writes nothing.  The library once went on with the
   unfilled arrays (a crash in clCreateContext), and took a failed query for 0 bytes ("too little
   local memory"). */
START_TEST(test_listing_failure)
{
    static const char *const whats[] = {"platforms", "devices", "local_mem"};
    static const char *const calls[] = {"clGetPlatformIDs", "clGetDeviceIDs", "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)"};
    const char *what = whats[_i], *call = calls[_i];
    const size_t shape[4] = {1, 1, 8, 4};
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP], e_fail[64];
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out");
    free(write_inputs(in, 8, shape));
    snprintf(e_fail, sizeof e_fail, "CASTLE_TEST_FAIL_LISTING=%s", what);
    cli_result r;
    run_failing(&r, dir, "forward", in, out, e_fail);
    char phrase[96];
    snprintf(phrase, sizeof phrase, "%s failed", call);
    expect(&r, 1, phrase, what);
    ck_assert_msg(!exists(out), "listing %s failed: the output directory was created", what);
    cli_free(&r);
}
END_TEST

START_TEST(test_allocation_failure_named)
{
    const alloc_case *ac = &alloc_cases[_i];
    const size_t shape[4] = {1, 2, 40, 8};
    const size_t n = shape[0] * shape[1] * shape[2] * shape[3];
    char dir[PATH_CAP], in[PATH_CAP], out[PATH_CAP], what[64];
    snprintf(what, sizeof what, "%s, failing the %s", ac->cmd, ac->workspace ? "workspace" : "first tensor");
    new_dir(dir);
    make_dir(in, dir, "in");
    join(out, dir, "out");
    float *v = write_inputs(in, 8, shape);
    if (!strcmp(ac->cmd, "backward"))
        write_npy(in, "do", v, 4, shape); /* any values: nothing runs */
    free(v);

    castle_context *ctx = h_context();
    ck_assert_msg(ctx, "no OpenCL device (CASTLE_DEVICE)");
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, shape[0], shape[1], shape[2], shape[3]);
    size_t ws = 0;
    ck_assert_msg(!castle_forward_workspace_size(ctx, &desc, &ws), "castle_forward_workspace_size: %s",
                  castle_last_error());
    const size_t tensor = n * sizeof(float);
    ck_assert_msg(ws > tensor + 1, "the workspace (%zu bytes) is not larger than a tensor (%zu bytes)", ws, tensor);
    const char *name = ac->workspace ? "workspace" : "qu";
    const size_t bytes = ac->workspace ? ws : tensor;

    cli_result r;
    run_preloaded(&r, dir, ac->cmd, in, out, ac->workspace ? tensor + 1 : tensor);
    char phrase[256];
    snprintf(phrase, sizeof phrase, "castle-run: could not allocate the device buffer %s of %zu bytes: %s\n", name,
             bytes, castle_status_string((castle_status)CL_MEM_OBJECT_ALLOCATION_FAILURE));
    expect(&r, 1, phrase, what);
    const char *first = strstr(r.err, "could not allocate");
    ck_assert_msg(!strstr(first + 1, "could not allocate"), "%s: more than one allocation reported:\n%s", what, r.err);
    ck_assert_msg(!exists(out), "%s: the output directory was created", what);
    cli_free(&r);

    if (!_i) { /* control: a threshold above every buffer changes nothing (the module forwards) */
        run_preloaded(&r, dir, ac->cmd, in, out, (unsigned long long)ws + 1);
        expect(&r, 0, NULL, "forward under the module, threshold above the workspace");
        char path[PATH_CAP];
        join(path, out, "o.npy");
        ck_assert_msg(exists(path), "forward under the module wrote no o.npy");
        cli_free(&r);
    }
}
END_TEST

/* ------------------------------------------------------------------------------------------------ */

static Suite *cli_suite(void)
{
    Suite *s = suite_create("castle-run");
    TCase *tc = tcase_create("forward");
    /* a cold kernel cache compiles the forward and the backward: on rusticl (llvmpipe) that took
       over 120 s for the backward on a loaded 2-core machine */
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_forward_matches_reference, 0, (int)(sizeof variants / sizeof variants[0]));
    tcase_add_test(tc, test_repeat_prints_median);
    tcase_add_loop_test(tc, test_backward_matches_reference, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("random");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_random_files);
    tcase_add_test(tc, test_random_seeds_independent);
    tcase_add_test(tc, test_random_range_edge);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_malformed_input, 0, NBAD);
    tcase_add_loop_test(tc, test_usage_error, 0, NUSAGE);
    tcase_add_test(tc, test_unknown_last_option);
    tcase_add_test(tc, test_help);
    tcase_add_test(tc, test_head_dim_too_large);
    tcase_add_test(tc, test_no_such_device);
    tcase_add_test(tc, test_build_failure_log);
    tcase_add_loop_test(tc, test_allocation_failure_named, 0, (int)(sizeof alloc_cases / sizeof alloc_cases[0]));
    tcase_add_loop_test(tc, test_listing_failure, 0, 3);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    const char *tmp = getenv("TMPDIR");
    const int n = snprintf(g_root, sizeof g_root, "%s/castle_test_cli_XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    if (n <= 0 || n >= (int)sizeof g_root || !mkdtemp(g_root)) {
        fprintf(stderr, "test_cli: cannot create a temporary directory: %s\n", strerror(errno));
        return EXIT_FAILURE;
    }
    SRunner *sr = srunner_create(cli_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    rm_rf(g_root);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
