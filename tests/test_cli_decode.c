/* castle-run decode end to end (CASTLE_RUN_PATH, spawned with posix_spawn): inputs written from
 * h_value, OUT/o.npy of decode compared with OUT/o.npy of forward on the same inputs and with the
 * fp64 reference, for several prompt lengths (0, P, L), chunks and windows; --repeat prints the
 * per-token time and the cache size; usage errors exit 2.  Files live under one mkdtemp() directory
 * made by main() and removed afterwards. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include "harness.h"
#include "npy.h"
#include "ref.h"
#include "tolerance.h"

#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef CASTLE_RUN_PATH
#error "CASTLE_RUN_PATH (the path of the castle-run binary, a string) must be defined"
#endif

extern char **environ;

static char g_root[512];
enum { B = 2, H = 2, L = 45, D = 16, N = B * H * L * D };
static const char *const names[6] = {"qu", "ku", "vu", "qc", "kc", "vc"};

/* Runs castle-run with args (NULL-terminated); stdout to g_root/out.txt.  Returns the exit status. */
static int run(const char *const *args)
{
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)CASTLE_RUN_PATH;
    for (; args[argc - 1] && argc < 31; ++argc)
        argv[argc] = (char *)args[argc - 1];
    argv[argc] = NULL;
    char out[600];
    snprintf(out, sizeof out, "%s/out.txt", g_root);
    posix_spawn_file_actions_t fa;
    ck_assert(!posix_spawn_file_actions_init(&fa));
    ck_assert(!posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    pid_t pid;
    ck_assert(!posix_spawn(&pid, CASTLE_RUN_PATH, &fa, NULL, argv, environ));
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void path(char *dst, size_t n, const char *a, const char *b) { snprintf(dst, n, "%s/%s", a, b); }

static float *load_o(const char *dir)
{
    char p[600], err[512];
    path(p, sizeof p, dir, "o.npy");
    npy_array a;
    ck_assert_msg(!npy_read_f32(p, &a, err, sizeof err), "%s", err);
    ck_assert(a.ndim == 4 && a.shape[0] == B && a.shape[1] == H && a.shape[2] == L && a.shape[3] == D);
    return a.data;
}

START_TEST(test_decode_matches_forward)
{
    static const struct {
        const char *prompt, *chunk, *window;
        int W;
    } runs[] = {{"10", "1", "0", 0}, {"0", "7", "3", 3}, {"45", "1", "5", 5}, {"33", "4", "100", 100}};
    const int r = _i;
    char in[600], fdir[600], ddir[600];
    path(in, sizeof in, g_root, "in");
    snprintf(fdir, sizeof fdir, "%s/f%d", g_root, r);
    snprintf(ddir, sizeof ddir, "%s/d%d", g_root, r);
    const char *fa[] = {"forward", "--in", in, "--out", fdir, "--window", runs[r].window, NULL};
    ck_assert_int_eq(run(fa), 0);
    const char *da[] = {"decode",  "--in",        in,         "--out",        ddir, "--prompt", runs[r].prompt,
                        "--chunk", runs[r].chunk, "--window", runs[r].window, NULL};
    ck_assert_int_eq(run(da), 0);
    float *of = load_o(fdir), *od = load_o(ddir);
    double e_fwd = 0, e_ref = 0, m = 1;
    for (size_t bh = 0; bh < B * H; ++bh) {
        double x[6][L * D], ro[L * D], rl[L];
        for (int t = 0; t < 6; ++t)
            for (size_t i = 0; i < L * D; ++i)
                x[t][i] = (float)h_value(5, (unsigned)t, bh / H, bh % H, i / D, i % D);
        ck_assert(!ref_forward_recurrent(L, D, runs[r].W, 1.0 / sqrt(D), x[0], x[1], x[2], x[3], x[4], x[5], ro, rl));
        for (size_t i = 0; i < L * D; ++i) {
            e_fwd = fmax(e_fwd, fabs(od[bh * L * D + i] - of[bh * L * D + i]));
            e_ref = fmax(e_ref, fabs(od[bh * L * D + i] - ro[i]));
            m = fmax(m, fabs(ro[i]));
        }
    }
    free(of);
    free(od);
    ck_assert_msg(e_fwd <= DECODE_TOL && e_ref / m <= DECODE_TOL,
                  "decode --prompt %s --chunk %s --window %s: against forward %.3g, against the reference %.3g",
                  runs[r].prompt, runs[r].chunk, runs[r].window, e_fwd, e_ref / m);
}
END_TEST

START_TEST(test_repeat_and_usage)
{
    char in[600], out[600], txt[600];
    path(in, sizeof in, g_root, "in");
    path(out, sizeof out, g_root, "rep");
    const char *rep[] = {"decode", "--in", in, "--out", out, "--prompt", "40", "--repeat", "3", NULL};
    ck_assert_int_eq(run(rep), 0);
    path(txt, sizeof txt, g_root, "out.txt");
    FILE *f = fopen(txt, "r");
    ck_assert(f);
    double ms = -1;
    size_t bytes = 0;
    char clock[16] = "";
    ck_assert_msg(fscanf(f, "median_ms=%lf clock=%15s cache_bytes=%zu", &ms, clock, &bytes) == 3,
                  "castle-run decode --repeat output");
    fclose(f);
    /* positive on either clock: where the device's profiling times are zero, the host clock is used */
    ck_assert_msg(ms > 0 && (!strcmp(clock, "device") || !strcmp(clock, "host")), "median_ms=%g clock=%s", ms, clock);
    ck_assert(bytes >= (size_t)B * H * 4 * (L + 4) * D * sizeof(float));
    const char *no_prompt[] = {"decode", "--in", in, "--out", out, NULL};
    ck_assert_int_eq(run(no_prompt), 2);
    const char *long_prompt[] = {"decode", "--in", in, "--out", out, "--prompt", "46", NULL};
    ck_assert_int_eq(run(long_prompt), 2);
    const char *zero_chunk[] = {"decode", "--in", in, "--out", out, "--prompt", "4", "--chunk", "0", NULL};
    ck_assert_int_eq(run(zero_chunk), 2);
}
END_TEST

static void rm_tree(const char *dir)
{
    const char *argv[] = {"rm", "-rf", dir, NULL};
    pid_t pid;
    if (!posix_spawnp(&pid, "rm", NULL, NULL, (char **)argv, environ))
        waitpid(pid, NULL, 0);
}

int main(void)
{
    snprintf(g_root, sizeof g_root, "%s/castle-cli-decode-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(g_root))
        return perror("mkdtemp"), EXIT_FAILURE;
    char in[600];
    path(in, sizeof in, g_root, "in");
    mkdir(in, 0777);
    static float v[N];
    const size_t shape[4] = {B, H, L, D};
    for (unsigned t = 0; t < 6; ++t) {
        for (size_t i = 0; i < N; ++i)
            v[i] = (float)h_value(5, t, i / (H * L * D), i / (L * D) % H, i / D % L, i % D);
        char p[700], err[512];
        snprintf(p, sizeof p, "%s/%s.npy", in, names[t]);
        if (npy_write_f32(p, v, 4, shape, err, sizeof err))
            return fprintf(stderr, "%s\n", err), EXIT_FAILURE;
    }
    Suite *s = suite_create("cli_decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_decode_matches_forward, 0, 4);
    tcase_add_test(tc, test_repeat_and_usage);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    rm_tree(g_root);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
