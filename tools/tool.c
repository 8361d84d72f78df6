/* The tools' shared device opener and profiled-median timer (tools/tool.h). */
#define _POSIX_C_SOURCE 200809L
#include "tool.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The context tool_open_device opened (until tool_close_device), whose build log tool_fail prints. */
static const castle_context *opened;

void tool_print_build_log(FILE *f, const castle_context *ctx, int max_lines)
{
    const char *log = castle_build_log(ctx);
    if (!log || !*log) {
        fprintf(f, "    build log: (empty)\n");
        return;
    }
    fprintf(f, "    build log (first %d lines):\n", max_lines);
    int lines = 0;
    const char *s = log;
    while (*s && lines < max_lines) {
        const char *nl = strchr(s, '\n');
        size_t len = nl ? (size_t)(nl - s) : strlen(s);
        if (len > 200)
            len = 200;
        fprintf(f, "      | %.*s\n", (int)len, s);
        ++lines;
        if (!nl)
            break;
        s = nl + 1;
    }
    if (*s && lines >= max_lines)
        fprintf(f, "      | ...\n");
}

int tool_fail(const char *prog, castle_status st, const char *what)
{
    const char *why = castle_last_error();
    fprintf(stderr, "%s: %s failed: %s\n", prog, what, why && *why ? why : castle_status_string(st));
    if (st == CASTLE_ERR_BUILD_FAILED && opened)
        tool_print_build_log(stderr, opened, TOOL_BUILD_LOG_LINES);
    return 1;
}

int tool_open_device(const char *prog, const char *spec, castle_context **ctx)
{
    castle_status st = castle_context_create_default(spec, ctx);
    if (st == CASTLE_SUCCESS) {
        opened = *ctx;
        return 0;
    }
    tool_fail(prog, st, "opening the device");
    return st == CASTLE_ERR_BAD_DEVICE_SPEC ? 2 : 1;
}

void tool_close_device(castle_context *ctx)
{
    if (ctx == opened)
        opened = NULL;
    castle_context_destroy(ctx);
}

double tool_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double tool_median(double *v, size_t n)
{
    if (!n)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

bool tool_device_clock(cl_event start, cl_event end, cl_ulong *t0, cl_ulong *t1)
{
    cl_ulong tq = 0;
    *t0 = *t1 = 0;
    return start && end && !clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_QUEUED, sizeof tq, &tq, NULL) &&
           !clGetEventProfilingInfo(start, CL_PROFILING_COMMAND_START, sizeof *t0, t0, NULL) &&
           !clGetEventProfilingInfo(end, CL_PROFILING_COMMAND_END, sizeof *t1, t1, NULL) && tq != 0 && *t0 != 0;
}

/* Device time from the start of `start` to the end of `end` in ms; < 0 when the device gives none
   (tool_device_clock) or the end is not after the start. */
static double device_ms(cl_event start, cl_event end)
{
    cl_ulong t0, t1;
    if (!tool_device_clock(start, end, &t0, &t1) || t1 <= t0)
        return -1;
    return (double)(t1 - t0) * 1e-6;
}

castle_status tool_warm(cl_command_queue q, tool_run_fn fn, void *state, long n)
{
    castle_status st = CASTLE_SUCCESS;
    for (long r = 0; r < n && !st; ++r) {
        cl_event end = NULL;
        st = fn(state, NULL, &end);
        if (end)
            clReleaseEvent(end);
    }
    return st ? st : (castle_status)clFinish(q);
}

castle_status tool_time_one(cl_command_queue q, tool_run_fn fn, void *state, double *dev_ms, double *wall_ms)
{
    cl_event start = NULL, end = NULL;
    const double h0 = tool_now_ms();
    castle_status st = (castle_status)clEnqueueMarkerWithWaitList(q, 0, NULL, &start);
    if (!st)
        st = fn(state, start, &end);
    if (!st)
        st = (castle_status)clFinish(q);
    *wall_ms = tool_now_ms() - h0;
    *dev_ms = st ? -1 : device_ms(start, end);
    if (start)
        clReleaseEvent(start);
    if (end)
        clReleaseEvent(end);
    return st;
}

void tool_timing_of(double *dev, double *wall, size_t n, tool_timing *out)
{
    bool profiled = n > 0;
    for (size_t r = 0; r < n; ++r)
        profiled = profiled && dev[r] > 0;
    out->wall_ms = tool_median(wall, n);
    out->ms = profiled ? tool_median(dev, n) : out->wall_ms;
    out->clock = profiled ? "device" : "host";
}

castle_status tool_time(cl_command_queue q, tool_run_fn fn, void *state, long warmup, long n, tool_timing *out)
{
    if (n < 1)
        return CASTLE_ERR_INVALID_ARGUMENT;
    double *dev = malloc((size_t)n * sizeof *dev), *wall = malloc((size_t)n * sizeof *wall);
    castle_status st = dev && wall ? tool_warm(q, fn, state, warmup) : CASTLE_ERR_OUT_OF_HOST_MEMORY;
    for (long r = 0; r < n && !st; ++r)
        st = tool_time_one(q, fn, state, &dev[r], &wall[r]);
    if (!st)
        tool_timing_of(dev, wall, (size_t)n, out);
    free(dev);
    free(wall);
    return st;
}

bool tool_parse_whole(const char *s, unsigned long long max, unsigned long long *v)
{
    unsigned long long x = 0;
    if (!*s)
        return false;
    for (; *s; ++s) {
        const unsigned digit = (unsigned)(*s - '0');
        if (digit > 9 || x > (max - digit) / 10)
            return false;
        x = 10 * x + digit;
    }
    *v = x;
    return true;
}

bool tool_list_whole(const char *s)
{
    return *s && *s != ',' && s[strlen(s) - 1] != ',' && !strstr(s, ",,");
}

bool tool_parse_names(const char *s, const char *const *names, int count, bool *sel, char *bad, size_t nbad)
{
    char buf[256];
    if (nbad)
        bad[0] = '\0';
    if (strlen(s) >= sizeof buf || !tool_list_whole(s))
        return false;
    strcpy(buf, s);
    memset(sel, 0, (size_t)count * sizeof(bool));
    bool any = false;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        int k = 0;
        while (k < count && strcmp(tok, names[k]))
            ++k;
        if (k == count) {
            if (nbad)
                snprintf(bad, nbad, "%s", tok);
            return false;
        }
        sel[k] = any = true;
    }
    return any;
}
