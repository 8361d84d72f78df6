/* The per-device tuning file: castle-tune writes an entry that a new context loads ("file"), the
   loaded configuration passes the conformance checks, and malformed or foreign entries are ignored. */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"
#include "tolerance.h"

#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_file[256];

static void device_ids(char *name, size_t nn, char *driver, size_t nd)
{
    cl_device_id dev = castle_context_device(h_context());
    ck_assert(dev);
    memset(name, 0, nn);
    memset(driver, 0, nd);
    clGetDeviceInfo(dev, CL_DEVICE_NAME, nn - 1, name, NULL);
    clGetDeviceInfo(dev, CL_DRIVER_VERSION, nd - 1, driver, NULL);
}

static void write_file(const char *text)
{
    FILE *f = fopen(g_file, "w");
    ck_assert(f);
    fputs(text, f);
    fclose(f);
}

static castle_context *open_with_file(castle_tuning *t)
{
    setenv("CASTLE_TUNING_FILE", g_file, 1);
    castle_context *ctx = NULL;
    castle_status st = castle_context_create_default(NULL, &ctx);
    unsetenv("CASTLE_TUNING_FILE");
    ck_assert_msg(st == CASTLE_SUCCESS, "%s", castle_last_error());
    ck_assert(castle_context_get_tuning(ctx, t) == CASTLE_SUCCESS);
    return ctx;
}

static void conformance(castle_context *ctx)
{
    static const h_fwd_case cases[] = {{2, 2, 70, 33, 0, H_BLHD, 1, 0, 51}, {1, 2, 130, 16, 5, H_BHLD, 1, 0, 52}};
    for (size_t k = 0; k < 2; ++k) {
        h_fwd_out out;
        ck_assert_msg(h_run_backward(ctx, castle_context_queue(ctx), &cases[k], H_GRAD_EXACT, false, &out) ==
                          CASTLE_SUCCESS,
                      "%s", castle_last_error());
        double g = 0;
        for (int q = 0; q < 6; ++q)
            g = fmax(g, out.err_grad[q]);
        ck_assert_msg(out.guards_ok && out.finite && out.err_o <= FORWARD_TOL && g <= BACKWARD_TOL,
                      "tuned configuration fails conformance: err_o %.3g grad %.3g", out.err_o, g);
    }
}

/* castle_tuning_table_entry lists the built-in table: distinct names, the default last, every entry
   a valid tuning string; the entry a context picks (no file, no CASTLE_TUNING) is the one listed under
   its name, value for value; an index past the end is refused with the count still given. */
START_TEST(test_table)
{
    size_t n = 0;
    ck_assert(castle_tuning_table_entry(0, NULL, NULL, &n) == CASTLE_SUCCESS);
    ck_assert_msg(n >= 2, "%zu entries", n);
    castle_context *ctx = NULL;
    unsetenv("CASTLE_TUNING");
    setenv("CASTLE_TUNING_FILE", "/nonexistent/castle-tuning.tsv", 1);
    ck_assert_msg(castle_context_create_default(NULL, &ctx) == CASTLE_SUCCESS, "%s", castle_last_error());
    unsetenv("CASTLE_TUNING_FILE");
    castle_tuning used;
    ck_assert(castle_context_get_tuning(ctx, &used) == CASTLE_SUCCESS);
    const char *picked = castle_context_tuning_name(ctx);
    bool found = false;
    for (size_t i = 0; i < n; ++i) {
        const char *name = NULL;
        castle_tuning t;
        char ts[256];
        ck_assert(castle_tuning_table_entry(i, &name, &t, NULL) == CASTLE_SUCCESS);
        ck_assert(name && *name);
        ck_assert(t.struct_size == sizeof(castle_tuning) && t.block > 0 && t.threads > 0 && t.dchunk > 0);
        ck_assert(castle_tuning_string(&t, ts, sizeof ts) == CASTLE_SUCCESS);
        /* castle.h: NULL arguments, and any size short of the string (0 too, which said NULL_POINTER) */
        char small[8] = "unset";
        ck_assert(castle_tuning_string(NULL, ts, sizeof ts) == CASTLE_ERR_NULL_POINTER);
        ck_assert(castle_tuning_string(&t, NULL, sizeof ts) == CASTLE_ERR_NULL_POINTER);
        ck_assert(castle_tuning_string(&t, small, 0) == CASTLE_ERR_INVALID_ARGUMENT && !strcmp(small, "unset"));
        ck_assert(castle_tuning_string(&t, small, sizeof small) == CASTLE_ERR_INVALID_ARGUMENT);
        const size_t len = strlen(ts);
        ck_assert(castle_tuning_string(&t, ts, len) == CASTLE_ERR_INVALID_ARGUMENT);
        ck_assert(castle_tuning_string(&t, ts, len + 1) == CASTLE_SUCCESS); /* exactly enough */
        for (size_t j = 0; j < i; ++j) {
            const char *other = NULL;
            ck_assert(castle_tuning_table_entry(j, &other, NULL, NULL) == CASTLE_SUCCESS);
            ck_assert_msg(strcmp(name, other), "two entries named %s", name);
        }
        if (i == n - 1)
            ck_assert_str_eq(name, "default");
        if (!strcmp(name, picked)) {
            found = true;
            ck_assert_msg(!memcmp(&t, &used, sizeof t), "the context's %s tuning differs from the table's %s", picked, ts);
        }
    }
    if (strcmp(picked, "shrunk")) /* a device too small for its entry runs a cut-down one */
        ck_assert_msg(found, "the context's entry %s is not in the listed table", picked);
    castle_context_destroy(ctx);
    size_t m = 0;
    ck_assert(castle_tuning_table_entry(n, NULL, NULL, &m) == CASTLE_ERR_INVALID_ARGUMENT);
    ck_assert(m == n);
    ck_assert_msg(strstr(castle_last_error(), "entries"), "%s", castle_last_error());
}
END_TEST

/* castle-tune --quick writes this device's entry; a new context loads it and computes correctly. */
START_TEST(test_tune_then_load)
{
    snprintf(g_file, sizeof g_file, "/tmp/castle_tuning_%ld.tsv", (long)getpid());
    remove(g_file);
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' --quick --L 96 --heads 1 --repeat 1 --file '%s' > /dev/null", CASTLE_TUNE_PATH,
             g_file);
    const int rc = system(cmd);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "castle-tune failed (%d)", rc);
    char name[256], driver[256], line[1024];
    device_ids(name, sizeof name, driver, sizeof driver);
    FILE *f = fopen(g_file, "r");
    ck_assert_msg(f, "castle-tune wrote no %s", g_file);
    char want[1024] = "";
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!t2)
            continue;
        *t1 = *t2 = '\0';
        if (!strcmp(line, name) && !strcmp(t1 + 1, driver))
            snprintf(want, sizeof want, "%s", t2 + 1);
    }
    fclose(f);
    ck_assert_msg(want[0], "no entry for '%s' / '%s' in %s", name, driver, g_file);
    castle_tuning got;
    castle_context *ctx = open_with_file(&got);
    ck_assert_str_eq(castle_context_tuning_name(ctx), "file");
    char have[1024];
    ck_assert(castle_tuning_string(&got, have, sizeof have) == CASTLE_SUCCESS);
    ck_assert_msg(!strcmp(have, want), "loaded %s, file says %s", have, want);
    conformance(ctx);
    castle_context_destroy(ctx);
    remove(g_file);
}
END_TEST

/* castle-tune --file in directories that do not exist yet (it made one level, and the default path
   ~/.config/castle/tuning.tsv needs two on a fresh account), and into a file whose last line has no
   newline (the entry joined that line: a comment, so it was never loaded).  Both load as "file". */
START_TEST(test_tune_file_edges)
{
    char dir[64], cmd[1024];
    snprintf(dir, sizeof dir, "/tmp/castle_tuning_dirs_%ld", (long)getpid());
    snprintf(g_file, sizeof g_file, "%s/a/b/tuning.tsv", dir);
    for (int round = 0; round < 2; ++round) {
        if (round) { /* the file now exists: a last line without its newline */
            FILE *f = fopen(g_file, "w");
            ck_assert(f && fputs("# a note", f) >= 0 && fclose(f) == 0);
        }
        snprintf(cmd, sizeof cmd, "'%s' --quick --budget 0 --L 96 --heads 1 --repeat 1 --file '%s' > /dev/null",
                 CASTLE_TUNE_PATH, g_file);
        const int rc = system(cmd);
        ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "round %d: castle-tune failed (%d)", round, rc);
        castle_tuning got;
        castle_context *ctx = open_with_file(&got);
        ck_assert_msg(!strcmp(castle_context_tuning_name(ctx), "file"), "round %d: the entry was not loaded (%s)",
                      round, castle_context_tuning_name(ctx));
        castle_context_destroy(ctx);
    }
    FILE *f = fopen(g_file, "r");
    char line[1024];
    ck_assert(f && fgets(line, sizeof line, f));
    fclose(f);
    ck_assert_str_eq(line, "# a note\n"); /* kept, and ended */
    remove(g_file);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert(system(cmd) == 0);
}
END_TEST

/* castle-tune's tuning file when it is not a plain writable file: a FIFO (the run waited on it for
   ever after the search) and a directory are refused before the search (exit 1), an empty --file is
   bad usage (2); a NUL byte in a comment keeps the lines after it (they were cut off, and the entry
   joined the comment); a symbolic link is written through (the file it names gets the entry, the
   link stays a link); a file beside which the lock and temporary files cannot be made
   (/proc/version, even for root) is refused before the search too (it was searched, then not written). */
static int run_tune(const char *args, const char *mark, const char *text, int *built, int *marked, char *out,
                    size_t n);

START_TEST(test_tune_file_kinds)
{
    char dir[64], path[160], link[160], cmd[1024];
    snprintf(dir, sizeof dir, "/tmp/castle_tuning_kinds_%ld", (long)getpid());
    ck_assert(mkdir(dir, 0755) == 0);
    const char *quick = "--quick --budget 0 --L 96 --heads 1 --repeat 1";
    snprintf(path, sizeof path, "%s/fifo", dir);
    ck_assert(mkfifo(path, 0644) == 0);
    static const struct { const char *name; int status; } kinds[] = {{"fifo", 1}, {"", 1}, {"''", 2}};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; ++k) {
        if (!strcmp(kinds[k].name, "''"))
            snprintf(cmd, sizeof cmd, "timeout 600 '%s' %s --file '' > /dev/null 2>&1", CASTLE_TUNE_PATH, quick);
        else
            snprintf(cmd, sizeof cmd, "timeout 600 '%s' %s --file '%s/%s' > /dev/null 2>&1", CASTLE_TUNE_PATH, quick,
                     dir, kinds[k].name);
        const int rc = system(cmd);
        ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == kinds[k].status, "--file %s: status %d, expected %d",
                      kinds[k].name, WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, kinds[k].status);
    }
    if (access("/proc/version", F_OK) == 0) {
        static char out[1 << 16];
        int built = 0, marked = 0;
        const int prc = run_tune("--quick --budget 0 --L 96 --heads 1 --repeat 1 --file /proc/version",
                                 "castle-tune:", "", &built, &marked, out, sizeof out);
        ck_assert_msg(prc == 1 && built == 0, "--file /proc/version: status %d, %d candidates built:\n%.2000s", prc,
                      built, out);
    }
    /* a NUL byte, behind a symbolic link */
    snprintf(path, sizeof path, "%s/real.tsv", dir);
    snprintf(link, sizeof link, "%s/link.tsv", dir);
    static const char content[] = "# notes\0 binary\nOtherGPU\t1.0\tblock=32\n";
    FILE *f = fopen(path, "wb");
    ck_assert(f && fwrite(content, 1, sizeof content - 1, f) == sizeof content - 1 && fclose(f) == 0);
    ck_assert(symlink("real.tsv", link) == 0);
    snprintf(cmd, sizeof cmd, "'%s' %s --file '%s' > /dev/null", CASTLE_TUNE_PATH, quick, link);
    int rc = system(cmd);
    ck_assert_msg(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "castle-tune through a link: %d", rc);
    struct stat st;
    ck_assert_msg(lstat(link, &st) == 0 && S_ISLNK(st.st_mode), "the link was replaced by a file");
    char buf[4096];
    f = fopen(path, "rb");
    ck_assert(f);
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    ck_assert_msg(n > sizeof content - 1 && !memcmp(buf, content, sizeof content - 1),
                  "the lines before the entry (a NUL byte among them) were not kept");
    ck_assert_msg(buf[n - 1] == '\n' && memchr(buf + sizeof content - 1, '\t', n - (sizeof content - 1)),
                  "no entry after them");
    strcpy(g_file, path);
    castle_tuning got;
    castle_context *ctx = open_with_file(&got);
    ck_assert_str_eq(castle_context_tuning_name(ctx), "file");
    castle_context_destroy(ctx);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert(system(cmd) == 0);
}
END_TEST

/* Runs castle-tune with args (stdout and stderr into out); counts the candidates built and the
   lines that start with mark and contain text.  Returns the exit status. */
static int run_tune(const char *args, const char *mark, const char *text, int *built, int *marked, char *out,
                    size_t n)
{
    char cmd[1024], line[1024];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", CASTLE_TUNE_PATH, args);
    FILE *p = popen(cmd, "r");
    ck_assert(p);
    *built = *marked = 0;
    out[0] = '\0';
    while (fgets(line, sizeof line, p)) {
        *built += strstr(line, " forward+backward ") != NULL && strstr(line, "(built and timed in ") != NULL;
        *marked += !strncmp(line, mark, strlen(mark)) && strstr(line, text);
        if (strlen(out) + strlen(line) < n)
            strcat(out, line);
    }
    const int rc = pclose(p);
    ck_assert_msg(WIFEXITED(rc), "castle-tune %s did not exit (%d)", args, rc);
    return WEXITSTATUS(rc);
}

/* Each of castle-tune's argument lists in bad is bad usage: exit status 2. */
static void check_bad_usage(const char *const *bad, size_t n)
{
    char cmd[1024];
    for (size_t k = 0; k < n; ++k) {
        snprintf(cmd, sizeof cmd, "'%s' %s > /dev/null 2>&1", CASTLE_TUNE_PATH, bad[k]);
        const int r = system(cmd);
        ck_assert_msg(WIFEXITED(r) && WEXITSTATUS(r) == 2, "castle-tune %s: status %d", bad[k], r);
    }
}

/* --max-tiles: a candidate whose work-items would own more micro-tiles than the cap is listed as
   "over" and not built; the start is exempt.  Under --quick the search stops at the first other
   shape; from every start in the built-in table that shape is threads = block, tm = tn = 1, whose
   work-items own block / vector >= 2 tiles, over a cap of 1.  So only the start is built, and, where
   the start's backward or forward has a shape of its own (bthreads, btm; fthreads, fdchunk: the CPU
   and GPU entries), the start with both following (stage 1's terms, exempt from the cap too);
   --dry-run writes nothing. */
START_TEST(test_tune_max_tiles)
{
    char out[8192];
    int built, over;
    const int rc = run_tune("--quick --max-tiles 1 --L 96 --heads 1 --repeat 1 --dry-run", "  over ",
                            "micro-tiles per work-item (--max-tiles 1), not built", &built, &over, out, sizeof out);
    ck_assert_msg(rc == 0, "castle-tune failed (%d):\n%s", rc, out);
    /* the start is the first timed line: does its backward or forward have a shape of its own? */
    const char *start = strstr(out, "\n  block=");
    unsigned th = 0, dc = 0, tm = 0, bth = 0, btm = 0, fth = 0, fdc = 0;
    ck_assert_msg(start && sscanf(strstr(start, ",threads="), ",threads=%u", &th) == 1 &&
                      sscanf(strstr(start, ",dchunk="), ",dchunk=%u", &dc) == 1 &&
                      sscanf(strstr(start, ",tm="), ",tm=%u", &tm) == 1 &&
                      sscanf(strstr(start, "bthreads="), "bthreads=%u", &bth) == 1 &&
                      sscanf(strstr(start, "btm="), "btm=%u", &btm) == 1 &&
                      sscanf(strstr(start, "fthreads="), "fthreads=%u", &fth) == 1 &&
                      sscanf(strstr(start, "fdchunk="), "fdchunk=%u", &fdc) == 1,
                  "no start line:\n%s", out);
    const int own = bth != th || btm != tm || fth != th || fdc != dc;
    ck_assert_msg(built == 1 + own && over == 1, "built %d (start's backward or forward of its own: %d), over %d:\n%s",
                  built, own, over, out);
    char want[64];
    snprintf(want, sizeof want, "candidates: %d run, 0 failed, ", 1 + own);
    ck_assert_msg(strstr(out, want) && strstr(out, " 1 over --max-tiles 1\n"), "%s", out);
    ck_assert_msg(!strstr(out, "written to"), "--dry-run wrote the file:\n%s", out);
    static const char *const bad[] = {"--max-tiles 0", "--max-tiles x", "--max-tiles"};
    check_bad_usage(bad, sizeof bad / sizeof bad[0]);
}
END_TEST

/* --budget: once the seconds are spent no candidate is started; the rest are listed as "late"
   and the best so far (here the start, which is exempt) is verified.  With --budget 0 only the
   start is built (under --quick the search then lists its first other shape, and on GPU entries
   the start with the backward on the forward's shape, as late). */
START_TEST(test_tune_budget)
{
    char out[8192], want[64];
    int built, late;
    const int rc = run_tune("--quick --budget 0 --L 96 --heads 1 --repeat 1 --dry-run", "  late ",
                            ": --budget 0 s spent, not built", &built, &late, out, sizeof out);
    ck_assert_msg(rc == 0, "castle-tune failed (%d):\n%s", rc, out);
    ck_assert_msg(built == 1 && late >= 1, "built %d, late %d:\n%s", built, late, out);
    snprintf(want, sizeof want, ", %d past --budget 0 s\n", late);
    ck_assert_msg(strstr(out, "candidates: 1 run, 0 failed, ") && strstr(out, want), "%s", out);
    ck_assert_msg(strstr(out, "verified against the fp64 reference"), "%s", out);
    static const char *const bad[] = {"--budget -1", "--budget x", "--budget 1.5", "--budget", "--d 257", "--L +5"};
    check_bad_usage(bad, sizeof bad / sizeof bad[0]);
}
END_TEST

/* The sum over threads, vector, tm and tn of |log2(shape / start)|: castle-tune's distance. */
static unsigned shape_distance(const unsigned *a, const unsigned *b)
{
    unsigned n = 0;
    for (int k = 0; k < 4; ++k) {
        unsigned x = a[k], y = b[k];
        for (; x > y; x /= 2)
            ++n;
        for (; y > x; y /= 2)
            ++n;
    }
    return n;
}

/* A full search under --budget 0 lists every candidate without building one; its first stage (the
   shapes at the start's block and dchunk, the backward following: bthreads=0) comes nearest to the
   start first, so a search cut short has tried the start's neighbours. */
START_TEST(test_tune_order)
{
    static char out[1 << 18];
    int built, listed;
    const int rc = run_tune("--budget 0 --L 96 --heads 1 --repeat 1 --dry-run", "  ", " not built", &built, &listed,
                            out, sizeof out);
    ck_assert_msg(rc == 0 && built == 1, "castle-tune: status %d, %d built:\n%.4000s", rc, built, out);
    unsigned start[6] = {0}, prev = 0;
    int stage1 = 0;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        unsigned t[6];
        const char *at = strstr(line, "block=");
        if (!at || sscanf(at, "block=%u,threads=%u,dchunk=%u,vector=%u,tm=%u,tn=%u", &t[0], &t[1], &t[2], &t[3],
                          &t[4], &t[5]) != 6)
            continue;
        if (!start[0]) { /* the start, built and timed first */
            ck_assert_msg(strstr(line, " forward+backward "), "first candidate not the start: %s", line);
            memcpy(start, t, sizeof start);
            continue;
        }
        if (t[0] != start[0] || t[2] != start[2] || !strstr(line, ",bthreads=0,"))
            continue; /* stages 2 to 4 */
        const unsigned a[4] = {t[1], t[3], t[4], t[5]}, b[4] = {start[1], start[3], start[4], start[5]};
        const unsigned dist = shape_distance(a, b);
        ck_assert_msg(dist >= prev, "distance %u after %u: %s", dist, prev, line);
        prev = dist;
        ++stage1;
    }
    ck_assert_msg(stage1 >= 3 && prev >= 2, "%d first-stage candidates listed, farthest %u", stage1, prev);
}
END_TEST

/* Entries for other devices or drivers, malformed lines and entries the device cannot run are
   ignored: the context falls back to the built-in table. */
START_TEST(test_file_ignored)
{
    snprintf(g_file, sizeof g_file, "/tmp/castle_tuning_bad_%ld.tsv", (long)getpid());
    char name[256], driver[256], text[4096];
    device_ids(name, sizeof name, driver, sizeof driver);
    castle_tuning table;
    ck_assert(castle_context_get_tuning(h_context(), &table) == CASTLE_SUCCESS);
    static const char *const bad[] = {
        "%s\tother-driver\tblock=16,threads=64,dchunk=16,vector=4\n", /* another driver */
        "%s\t%s\tblock=12,threads=64,dchunk=16,vector=4\n",            /* invalid block */
        "%s\t%s\tblocks=16\n",                                         /* unknown key */
        "%s %s block=16,threads=64,dchunk=16,vector=4\n",              /* not tab-separated */
        "%s\t%s\n",                                                    /* no tuning field */
        "%s\t%s\t\n",                                                  /* an empty one (it was taken) */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; ++k) {
        snprintf(text, sizeof text, bad[k], name, driver);
        write_file(text);
        castle_tuning got;
        castle_context *ctx = open_with_file(&got);
        ck_assert_msg(strcmp(castle_context_tuning_name(ctx), "file"), "entry %zu was used", k);
        ck_assert(got.block == table.block && got.threads == table.threads && got.dchunk == table.dchunk);
        castle_context_destroy(ctx);
    }
    snprintf(text, sizeof text, "# comment\nsome-other-device\t1.0\tblock=64,threads=64,dchunk=64,vector=4\n"
                                "%s\t%s\tblock=16,threads=64,dchunk=16\n", name, driver);
    write_file(text); /* a valid line after foreign ones; vector left to the device default */
    castle_tuning got;
    castle_context *ctx = open_with_file(&got);
    ck_assert_str_eq(castle_context_tuning_name(ctx), "file");
    ck_assert(got.block == 16 && got.threads == 64 && got.dchunk == 16 && got.vector >= 1);
    castle_context_destroy(ctx);
    remove(g_file);
}
END_TEST

/* Only a regular file of at most 1 MiB is read: a device that never ends (/dev/zero), a FIFO with no
   writer (opening it would block), a directory and an oversized file are skipped, promptly. */
START_TEST(test_file_not_regular)
{
    char fifo[256], dir[256], big[256], name[256], driver[256];
    snprintf(fifo, sizeof fifo, "/tmp/castle_tuning_fifo_%ld", (long)getpid());
    snprintf(dir, sizeof dir, "/tmp/castle_tuning_dir_%ld", (long)getpid());
    snprintf(big, sizeof big, "/tmp/castle_tuning_big_%ld.tsv", (long)getpid());
    remove(fifo);
    ck_assert(mkfifo(fifo, 0600) == 0);
    rmdir(dir);
    ck_assert(mkdir(dir, 0700) == 0);
    device_ids(name, sizeof name, driver, sizeof driver);
    FILE *f = fopen(big, "w"); /* a valid entry for this device after 1 MiB of comments: not read */
    ck_assert(f);
    for (int k = 0; k < 20000; ++k)
        fputs("# padding padding padding padding padding padding padding padding\n", f);
    fprintf(f, "%s\t%s\tblock=16,threads=64,dchunk=16\n", name, driver);
    fclose(f);
    const char *paths[] = {"/dev/zero", fifo, dir, big};
    castle_tuning table;
    ck_assert(castle_context_get_tuning(h_context(), &table) == CASTLE_SUCCESS);
    for (size_t k = 0; k < sizeof paths / sizeof paths[0]; ++k) {
        snprintf(g_file, sizeof g_file, "%s", paths[k]);
        castle_tuning got;
        castle_context *ctx = open_with_file(&got);
        ck_assert_msg(strcmp(castle_context_tuning_name(ctx), "file"), "%s was read as a tuning file", paths[k]);
        ck_assert(got.block == table.block && got.threads == table.threads && got.dchunk == table.dchunk);
        castle_context_destroy(ctx);
    }
    remove(fifo);
    rmdir(dir);
    remove(big);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("tuning");
    TCase *tc = tcase_create("file");
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_table);
    tcase_add_test(tc, test_file_ignored);
    tcase_add_test(tc, test_file_not_regular);
    suite_add_tcase(s, tc);
    tc = tcase_create("tune"); /* castle-tune builds and times a candidate besides the entry */
    tcase_set_tags(tc, "variants"); /* tests/CMakeLists.txt: castle_variants */
    tcase_set_timeout(tc, 900);
    tcase_add_test(tc, test_tune_then_load);
    tcase_add_test(tc, test_tune_file_edges);
    tcase_add_test(tc, test_tune_file_kinds);
    tcase_add_test(tc, test_tune_max_tiles);
    tcase_add_test(tc, test_tune_budget);
    tcase_add_test(tc, test_tune_order);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
