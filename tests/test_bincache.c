/* The on-disk program-binary cache (host/bincache.c): a second process loads instead of compiling,
   an unusable or corrupt cache is skipped silently, CASTLE_CACHE_DIR=off disables it. */
#define _POSIX_C_SOURCE 200809L
#include "harness.h"
#include "tolerance.h"

#include <check.h>
#include <dirent.h>
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
        n += strstr(e->d_name, ".bin") && !strstr(e->d_name, ".tmp");
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
    char *log = run_once(); /* second process (this one): loads */
    ck_assert_msg(strstr(log, LOADED), "the second process compiled again; build log: %s", log);
    free(log);
    remove_dir(g_dir);
}
END_TEST

START_TEST(test_corrupt_entry_recompiles)
{
    fresh_dir();
    free(run_once());
    DIR *d = opendir(g_dir);
    ck_assert(d);
    char path[512] = "";
    for (struct dirent *e; (e = readdir(d));)
        if (strstr(e->d_name, ".bin"))
            snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
    closedir(d);
    ck_assert(path[0]);
    FILE *f = fopen(path, "r+b"); /* keep the header, garble the binary */
    ck_assert(f);
    fseek(f, 40, SEEK_SET);
    for (int i = 0; i < 4096; ++i)
        fputc(0x5a, f);
    fclose(f);
    char *log = run_once();
    ck_assert_msg(!strstr(log, LOADED), "a corrupt entry was used");
    free(log);
    truncate(path, 20); /* a short file */
    log = run_once();
    ck_assert_msg(!strstr(log, LOADED), "a truncated entry was used");
    free(log);
    remove_dir(g_dir);
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
    TCase *tc = tcase_create("cache");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_second_process_loads);
    tcase_add_test(tc, test_corrupt_entry_recompiles);
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
