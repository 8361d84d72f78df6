/* The on-disk program-binary cache (host/bincache.c, host/program.c): a second process loads
   instead of compiling; a damaged entry (any byte flipped, truncated, extended) is never handed to
   the driver but deleted and rebuilt, with outputs bitwise those of a clean build; a well-formed
   entry the driver cannot make kernels from is rebuilt too, and so is a FIFO or a directory in an
   entry's place (never opened for reading); a build from source prints no compiler
   warning count (host/program.h, CASTLE_BUILD_QUIET); concurrent stores from many threads
   never mix; an unusable cache is skipped silently; CASTLE_CACHE_DIR=off disables it.

   PoCL keeps its own kernel cache ($POCL_CACHE_DIR): the end-to-end corruption tests point it at a
   fresh folder, so what they see does not depend on what earlier runs left there. */
#define _POSIX_C_SOURCE 200809L
#include "bincache.h" /* host/bincache.c is compiled into this test: the entry format and checksum */
#include "harness.h"
#include "tolerance.h"

#include <check.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *const LOADED = "loaded from the on-disk cache";

static char g_dir[256];

static void fresh_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/castle_bincache_XXXXXX");
    ck_assert(mkdtemp(g_dir));
    setenv("CASTLE_CACHE_DIR", g_dir, 1);
}

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
    {
        const size_t len = strlen(e->d_name);
        n += len > 4 && !strcmp(e->d_name + len - 4, ".bin");
    }
    closedir(d);
    return n;
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        char path[512];
        for (struct dirent *e; (e = readdir(d));)
            if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
                snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
                remove(path);
            }
        closedir(d);
    }
    rmdir(dir);
}

/* A new context runs one small forward against the reference; returns its build log (malloc'd). */
static char *run_once(void)
{
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    h_fwd_case c = {1, 2, 40, 8, 0, H_BHLD, 1, 0, 3};
    h_fwd_out out;
    castle_status st = h_run_forward(ctx, castle_context_queue(ctx), &c, true, false, &out);
    ck_assert_msg(st == CASTLE_SUCCESS, "forward: %s", castle_last_error());
    ck_assert_msg(out.err_o <= FORWARD_TOL && out.guards_ok, "wrong result (err %.3g)", out.err_o);
    char *log = strdup(castle_build_log(ctx));
    castle_context_destroy(ctx);
    return log;
}

START_TEST(test_second_process_loads)
{
    fresh_dir();
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) { /* first process: compiles and stores */
        char *log = run_once();
        _exit(strstr(log, LOADED) ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the first process did not compile (status %d)",
                  status);
    ck_assert_msg(count_entries(g_dir) >= 1, "no binary stored in %s", g_dir);
    /* entries are made as any file is (0644 less the umask), so that the users of a shared cache
       directory read each other's (they were 0600) */
    const mode_t mask = umask(022);
    umask(mask);
    DIR *dir = opendir(g_dir);
    ck_assert(dir);
    for (struct dirent *e; (e = readdir(dir));) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        if (e->d_name[0] != '.' && stat(p, &st) == 0)
            ck_assert_msg((st.st_mode & 0777) == (0644 & ~mask), "%s has mode %o, not 0644 less the umask %o", p,
                          (unsigned)(st.st_mode & 0777), (unsigned)mask);
    }
    closedir(dir);
    char *log = run_once(); /* second process (this one): loads */
    ck_assert_msg(strstr(log, LOADED), "the second process compiled again; build log: %s", log);
    free(log);
    remove_dir(g_dir);
}
END_TEST

/* ---- the entry format, without a device ---------------------------------------------------- */

/* "CASTLEBIN2\0" | key hash | payload size | payload checksum | payload (host/bincache.c). */
enum { OFF_KEY = 11, OFF_SIZE = 19, OFF_SUM = 27, HEADER = 35 };

static const char *const UNIT_KEY[] = {"source", "-DBLK=32", "device", "vendor", "driver", "device version", "platform"};
enum { UNIT_NKEY = 7 };

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)len + 1);
    ck_assert(buf);
    ck_assert(fread(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void write_all(const char *path, const unsigned char *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f, "cannot write %s", path);
    ck_assert(fwrite(data, 1, n, f) == n);
    ck_assert(fclose(f) == 0);
}

/* The path of the one .bin entry in dir (fails the test if there is not exactly one). */
static void the_entry(const char *dir, char *path, size_t n)
{
    ck_assert_int_eq(count_entries(dir), 1);
    DIR *d = opendir(dir);
    ck_assert(d);
    for (struct dirent *e; (e = readdir(d));) {
        const size_t len = strlen(e->d_name);
        if (len > 4 && !strcmp(e->d_name + len - 4, ".bin"))
            snprintf(path, n, "%s/%s", dir, e->d_name);
    }
    closedir(d);
}

/* Every single-byte change of an entry, header or payload, makes it unusable and deletes it. */
START_TEST(test_every_flipped_byte_is_rejected)
{
    fresh_dir();
    unsigned char payload[3000];
    for (size_t i = 0; i < sizeof payload; ++i)
        payload[i] = (unsigned char)(i * 37 + 11);
    castle__bincache_store(UNIT_KEY, UNIT_NKEY, payload, sizeof payload);
    char path[512];
    the_entry(g_dir, path, sizeof path);
    size_t n = 0;
    unsigned char *clean = read_all(path, &n);
    ck_assert_uint_eq(n, HEADER + sizeof payload);
    unsigned char *bin = NULL;
    size_t len = 0;
    ck_assert_msg(castle__bincache_load(UNIT_KEY, UNIT_NKEY, &bin, &len), "a clean entry did not load");
    ck_assert(len == sizeof payload && !memcmp(bin, payload, len));
    free(bin);
    int accepted = 0, kept = 0;
    for (size_t off = 0; off < n; ++off)
        for (int bit = 0; bit < 8; bit += 7) { /* the lowest and the highest bit of each byte */
            clean[off] ^= (unsigned char)(1u << bit);
            write_all(path, clean, n);
            clean[off] ^= (unsigned char)(1u << bit);
            bin = NULL;
            if (castle__bincache_load(UNIT_KEY, UNIT_NKEY, &bin, &len)) {
                ++accepted;
                free(bin);
            }
            kept += access(path, F_OK) == 0;
        }
    ck_assert_msg(accepted == 0, "%d of %zu single-bit changes were accepted", accepted, 2 * n);
    ck_assert_msg(kept == 0, "%d damaged entries were left in place", kept);
    /* truncated anywhere, or one byte longer */
    for (size_t cut = 0; cut <= n; cut += cut < HEADER + 8 ? 1 : 499) {
        write_all(path, clean, cut == n ? n : cut);
        if (cut == n) { /* extended by one byte */
            FILE *f = fopen(path, "ab");
            ck_assert(f && fputc(0, f) == 0 && fclose(f) == 0);
        }
        bin = NULL;
        ck_assert_msg(!castle__bincache_load(UNIT_KEY, UNIT_NKEY, &bin, &len), "a file of %zu bytes loaded",
                      cut == n ? n + 1 : cut);
        ck_assert_msg(access(path, F_OK) != 0, "a damaged entry of %zu bytes was left in place", cut);
    }
    free(clean);
    remove_dir(g_dir);
}
END_TEST

/* Threads of one process store the same entry at once while others load it: every load after the
   first sees one writer's whole payload, the last entry loads, and no temporary file is left. */
enum { STORE_THREADS = 8, STORES = 100, PAYLOAD = 200000 };

static void *store_loop(void *arg)
{
    const unsigned t = (unsigned)(uintptr_t)arg;
    const size_t n = PAYLOAD + 4099 * t; /* every writer a different size: a mixed file cannot pass */
    unsigned char *p = malloc(n);
    memset(p, (int)(t + 1), n);
    for (int i = 0; i < STORES; ++i)
        castle__bincache_store(UNIT_KEY, UNIT_NKEY, p, n);
    free(p);
    return NULL;
}

/* Once an entry exists it is only ever replaced whole (rename), so after a loader's first success
   every later load must succeed too, each with one writer's whole payload. */
static void *load_loop(void *arg)
{
    int *bad = arg;
    bool seen = false;
    for (int i = 0; i < 4 * STORES; ++i) {
        unsigned char *bin = NULL;
        size_t len = 0;
        if (!castle__bincache_load(UNIT_KEY, UNIT_NKEY, &bin, &len)) {
            *bad += seen;
            continue;
        }
        seen = true;
        const unsigned t = bin[0] - 1u;
        bool whole = t < STORE_THREADS && len == PAYLOAD + 4099 * t;
        for (size_t j = 0; whole && j < len; ++j)
            whole = bin[j] == bin[0];
        *bad += !whole;
        free(bin);
    }
    return NULL;
}

START_TEST(test_concurrent_stores)
{
    fresh_dir();
    pthread_t th[STORE_THREADS + 2];
    int mixed[2] = {0, 0};
    for (unsigned t = 0; t < STORE_THREADS; ++t)
        ck_assert(pthread_create(&th[t], NULL, store_loop, (void *)(uintptr_t)t) == 0);
    for (int r = 0; r < 2; ++r)
        ck_assert(pthread_create(&th[STORE_THREADS + r], NULL, load_loop, &mixed[r]) == 0);
    for (int t = 0; t < STORE_THREADS + 2; ++t)
        pthread_join(th[t], NULL);
    ck_assert_msg(mixed[0] + mixed[1] == 0, "%d of %d loads found a damaged entry after a good one",
                  mixed[0] + mixed[1], 8 * STORES);
    unsigned char *bin = NULL;
    size_t len = 0;
    ck_assert_msg(castle__bincache_load(UNIT_KEY, UNIT_NKEY, &bin, &len),
                  "after %d concurrent stores the entry does not load", STORE_THREADS * STORES);
    free(bin);
    DIR *d = opendir(g_dir);
    ck_assert(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));)
        files += e->d_name[0] != '.';
    closedir(d);
    ck_assert_msg(files == 1, "%d files in the cache folder (temporary files left behind?)", files);
    remove_dir(g_dir);
}
END_TEST

/* ---- damaged entries on the device: rebuilt, outputs bitwise those of a clean build --------- */

static char g_work[256];  /* clean.bin: a clean forward entry; clean.f32: that run's o then lse */
static char g_pocl[300];  /* PoCL's kernel cache for these tests */
static const h_fwd_case CASE = {1, 2, 40, 8, 0, H_BHLD, 1, 0, 3};

/* A fresh context runs CASE; returns the build log (malloc'd) and o then lse in *out (malloc'd). */
static char *run_keep(float **out, size_t *n)
{
    castle_context *ctx = NULL;
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    h_fwd_out r;
    castle_status st = h_run_forward(ctx, castle_context_queue(ctx), &CASE, false, true, &r);
    ck_assert_msg(st == CASTLE_SUCCESS, "forward: %s", castle_last_error());
    const size_t no = CASE.B * CASE.H * CASE.L * CASE.d, nl = CASE.B * CASE.H * CASE.L;
    *n = no + nl;
    *out = malloc(*n * sizeof(float));
    memcpy(*out, r.o, no * sizeof(float));
    memcpy(*out + no, r.lse, nl * sizeof(float));
    h_fwd_out_free(&r);
    char *log = strdup(castle_build_log(ctx));
    castle_context_destroy(ctx);
    return log;
}

static void path_in(char *buf, size_t n, const char *dir, const char *name) { snprintf(buf, n, "%s/%s", dir, name); }

/* Runs in a child process, so that the Check parent never loads an OpenCL driver. */
static void make_clean(void)
{
    snprintf(g_work, sizeof g_work, "/tmp/castle_bincache_work_XXXXXX");
    ck_assert(mkdtemp(g_work));
    path_in(g_pocl, sizeof g_pocl, g_work, "pocl");
    ck_assert(mkdir(g_pocl, 0755) == 0);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        setenv("POCL_CACHE_DIR", g_pocl, 1);
        char dir[300], path[600];
        path_in(dir, sizeof dir, g_work, "clean");
        mkdir(dir, 0755);
        setenv("CASTLE_CACHE_DIR", dir, 1);
        path_in(path, sizeof path, g_work, "stderr.txt"); /* this build compiles, PoCL's cache being empty */
        if (!freopen(path, "w", stderr))
            _exit(2);
        float *out;
        size_t n;
        free(run_keep(&out, &n));
        char entry[600];
        the_entry(dir, entry, sizeof entry);
        size_t len;
        unsigned char *bin = read_all(entry, &len);
        path_in(path, sizeof path, g_work, "clean.bin");
        write_all(path, bin, len);
        path_in(path, sizeof path, g_work, "clean.f32");
        write_all(path, (const unsigned char *)out, n * sizeof(float));
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the clean build failed (status %d)", status);
    /* The kernels are built with -w (host/program.h): PoCL's compiler printed "65 warnings
       generated." to stderr without it.  Other output of a driver's own is not the library's. */
    char path[600];
    path_in(path, sizeof path, g_work, "stderr.txt");
    size_t len = 0;
    unsigned char *text = read_all(path, &len);
    ck_assert_msg(text, "no %s", path);
    char *s = calloc(len + 1, 1);
    ck_assert(s);
    memcpy(s, text, len);
    ck_assert_msg(!strstr(s, " generated."), "a kernel build printed a compiler's warning count: '%s'", s);
    free(s);
    free(text);
}

static void remove_clean(void)
{
    char cmd[600]; /* PoCL's cache holds sub-folders */
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_work);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_work);
}

enum { AS_FILE, AS_FIFO, AS_DIR };

/* Installs `entry` (n bytes) as the cache's only entry under the clean entry's name (or, by `kind`,
   a FIFO or an empty directory there), then: a run must not load it, must give the clean outputs
   bitwise, and must leave an entry that the next run loads, with the clean outputs again. */
static void expect_rebuilt(const unsigned char *entry, size_t n, int kind, const char *what)
{
    setenv("POCL_CACHE_DIR", g_pocl, 1);
    fresh_dir();
    char clean_path[600], name[600];
    path_in(clean_path, sizeof clean_path, g_work, "clean");
    the_entry(clean_path, name, sizeof name);
    char path[600];
    path_in(path, sizeof path, g_dir, strrchr(name, '/') + 1);
    if (kind == AS_FIFO)
        ck_assert_msg(mkfifo(path, 0600) == 0, "mkfifo %s", path);
    else if (kind == AS_DIR)
        ck_assert_msg(mkdir(path, 0700) == 0, "mkdir %s", path);
    else
        write_all(path, entry, n);
    size_t nref;
    path_in(clean_path, sizeof clean_path, g_work, "clean.f32");
    float *ref = (float *)read_all(clean_path, &nref);
    ck_assert(ref);
    for (int run = 0; run < 2; ++run) {
        float *out;
        size_t nout;
        char *log = run_keep(&out, &nout);
        ck_assert_uint_eq(nout * sizeof(float), nref);
        size_t differ = 0;
        for (size_t i = 0; i < nout; ++i)
            differ += memcmp(&out[i], &ref[i], sizeof(float)) != 0;
        ck_assert_msg(differ == 0, "%s: run %d: %zu of %zu outputs differ from a clean build", what, run, differ, nout);
        if (run == 0)
            ck_assert_msg(!strstr(log, LOADED), "%s: the damaged entry was used", what);
        else
            ck_assert_msg(strstr(log, LOADED), "%s: the entry was not replaced by a good one (log: %s)", what, log);
        free(out);
        free(log);
    }
    free(ref);
    remove_dir(g_dir);
}

/* Not a file at an entry's path: a FIFO (whose open waited for a writer: the run hung) or an empty
   directory.  Neither is read; it is removed and a good entry stored in its place. */
START_TEST(test_not_a_file_is_replaced)
{
    expect_rebuilt(NULL, 0, _i ? AS_DIR : AS_FIFO, _i ? "an empty directory at the entry's path"
                                                           : "a FIFO at the entry's path");
}
END_TEST

enum { FLIPS = 40 };

/* Iteration i < FLIPS flips one byte: in the four header fields, at 63% of the file (where the
   issue's wrong outputs came from), then across the payload from its first byte to its last;
   then three truncations and one appended byte. */
START_TEST(test_damaged_entry_is_rebuilt)
{
    char path[600];
    path_in(path, sizeof path, g_work, "clean.bin");
    size_t n = 0;
    unsigned char *e = read_all(path, &n);
    ck_assert(e && n > HEADER + 100);
    char what[128];
    if (_i < FLIPS) {
        static const size_t header[] = {3, OFF_KEY + 2, OFF_SIZE, OFF_SUM + 5};
        const size_t off = _i < 4 ? header[_i]
                          : _i == 4 ? n * 63 / 100
                                    : HEADER + (n - 1 - HEADER) * (size_t)(_i - 5) / (FLIPS - 6);
        e[off] ^= 0xff;
        snprintf(what, sizeof what, "byte %zu of %zu flipped", off, n);
        expect_rebuilt(e, n, AS_FILE, what);
    } else if (_i < FLIPS + 3) {
        static const double keep[] = {0.0, 0.5, 0.999};
        const size_t cut = (size_t)(HEADER + (n - HEADER) * keep[_i - FLIPS]);
        snprintf(what, sizeof what, "cut to %zu of %zu bytes", cut, n);
        expect_rebuilt(e, cut, AS_FILE, what);
    } else {
        e = realloc(e, n + 1);
        e[n] = 0;
        snprintf(what, sizeof what, "one byte appended to %zu", n);
        expect_rebuilt(e, n + 1, AS_FILE, what);
    }
    free(e);
}
END_TEST

/* A well-formed entry (checksum right) whose binary the driver accepts but cannot make the
   forward's kernels from: a valid program of this device without them.  clCreateProgramWithBinary
   and clBuildProgram succeed and only clCreateKernel fails, the way rusticl fails on some binaries;
   the program must be rebuilt from source.  (Malformed binaries with a right checksum are no case
   here: drivers abort the process on them, PoCL on half a binary, rusticl on random bytes, which is
   why a damaged entry must never reach the driver.) */
START_TEST(test_rejected_binary_is_rebuilt)
{
    char path[600];
    path_in(path, sizeof path, g_work, "clean.bin");
    size_t n = 0;
    unsigned char *clean = read_all(path, &n);
    ck_assert(clean);
    setenv("POCL_CACHE_DIR", g_pocl, 1);
    castle_context *ctx = NULL;
    ck_assert(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS);
    const char *src = "__kernel void not_a_castle_kernel(__global float *x) { x[0] = 1.0f; }\n";
    cl_int err;
    cl_program p = clCreateProgramWithSource(castle_context_cl_context(ctx), 1, &src, NULL, &err);
    ck_assert(p);
    cl_device_id dev = castle_context_device(ctx);
    ck_assert(clBuildProgram(p, 1, &dev, NULL, NULL, NULL) == CL_SUCCESS);
    size_t len = 0;
    ck_assert(clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof len, &len, NULL) == CL_SUCCESS && len > 0);
    unsigned char *payload = malloc(len);
    unsigned char *bins[1] = {payload};
    ck_assert(clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL) == CL_SUCCESS);
    clReleaseProgram(p);
    castle_context_destroy(ctx);
    unsigned char *e = malloc(HEADER + len);
    memcpy(e, clean, OFF_SIZE); /* the clean entry's magic and key hash */
    const uint64_t size = len, sum = castle__bincache_checksum(payload, len);
    memcpy(e + OFF_SIZE, &size, sizeof size);
    memcpy(e + OFF_SUM, &sum, sizeof sum);
    memcpy(e + HEADER, payload, len);
    expect_rebuilt(e, HEADER + len, AS_FILE, "a valid binary of a program without the forward's kernels");
    free(e);
    free(payload);
    free(clean);
}
END_TEST

START_TEST(test_unusable_dir_is_skipped)
{
    static const char *const bad[] = {"/proc/castle-no-such-dir", "/dev/null", "/nonexistent/a/b/c"};
    setenv("CASTLE_CACHE_DIR", bad[_i], 1);
    char *log = run_once();
    ck_assert_msg(!strstr(log, LOADED), "loaded from an unusable directory");
    free(log);
}
END_TEST

START_TEST(test_off_writes_nothing)
{
    fresh_dir();
    setenv("CASTLE_CACHE_DIR", "off", 1);
    free(run_once());
    ck_assert_int_eq(count_entries(g_dir), 0);
    char *log = run_once();
    ck_assert_msg(!strstr(log, LOADED), "CASTLE_CACHE_DIR=off still loaded a binary");
    free(log);
    remove_dir(g_dir);
}
END_TEST

/* The tuning is part of the key: another block size is another entry, not a stale binary. */
START_TEST(test_tuning_in_key)
{
    fresh_dir();
    free(run_once());
    const int before = count_entries(g_dir);
    setenv("CASTLE_TUNING", "block=16,threads=64,dchunk=16", 1);
    char *log = run_once();
    unsetenv("CASTLE_TUNING");
    ck_assert_msg(!strstr(log, LOADED), "another tuning loaded the first tuning's binary");
    ck_assert_int_gt(count_entries(g_dir), before);
    free(log);
    remove_dir(g_dir);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bincache");
    TCase *unit = tcase_create("format");
    tcase_set_timeout(unit, 120);
    tcase_add_test(unit, test_every_flipped_byte_is_rejected);
    tcase_add_test(unit, test_concurrent_stores);
    suite_add_tcase(s, unit);
    TCase *damaged = tcase_create("damaged");
    tcase_set_timeout(damaged, 300);
    tcase_add_unchecked_fixture(damaged, make_clean, remove_clean);
    tcase_add_loop_test(damaged, test_damaged_entry_is_rebuilt, 0, FLIPS + 4);
    tcase_add_test(damaged, test_rejected_binary_is_rebuilt);
    tcase_add_loop_test(damaged, test_not_a_file_is_replaced, 0, 2);
    suite_add_tcase(s, damaged);
    TCase *tc = tcase_create("cache");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_second_process_loads);
    tcase_add_loop_test(tc, test_unusable_dir_is_skipped, 0, 3);
    tcase_add_test(tc, test_off_writes_nothing);
    tcase_add_test(tc, test_tuning_in_key);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
