/* What the libcastle tools share: opening the device, parsing a list of names, and timing an
 * operation.
 *
 * Timing: one profiled-median timer.  Each timed run is enqueued after a marker; its time is the
 * device time from the marker's start to the end of the run's last event (OpenCL profiling), so
 * host work does not count.  Every run is also timed on the host, from before the marker is
 * enqueued to after clFinish.  Where the device reports no profiling time for some run (an error,
 * or zero timestamps, as some implementations give), the host times are used instead, and the
 * result says so: clock is "device" or "host", and the tools print it on the line (clock=...). */
#ifndef CASTLE_TOOLS_TOOL_H
#define CASTLE_TOOLS_TOOL_H

#include "castle/castle.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Opens the device spec names (NULL: $CASTLE_DEVICE, else 0:0) with castle_context_create_default.
   On failure prints "<prog>: opening the device failed: <reason>" to stderr and returns 2 for a
   malformed spec (bad usage), 1 otherwise; 0 on success. */
int tool_open_device(const char *prog, const char *spec, castle_context **ctx);

/* Prints "<prog>: <what> failed: <castle_last_error() or the status name>" to stderr, and for
   CASTLE_ERR_BUILD_FAILED the first TOOL_BUILD_LOG_LINES lines of the compiler's log of the context
   tool_open_device opened (file:line of cl/, host/program.c); returns 1. */
int tool_fail(const char *prog, castle_status st, const char *what);
#define TOOL_BUILD_LOG_LINES 12

/* castle_context_destroy(ctx), and tool_fail forgets it where tool_open_device opened it. */
void tool_close_device(castle_context *ctx);

/* The first max_lines lines of ctx's newest build log (castle_build_log), indented, to f; lines
   longer than 200 characters are cut. */
void tool_print_build_log(FILE *f, const castle_context *ctx, int max_lines);

/* One run of an operation: enqueue it on its queue after `wait` (NULL: nothing to wait for) and
   return the event of its last command in *end. */
typedef castle_status (*tool_run_fn)(void *state, cl_event wait, cl_event *end);

typedef struct tool_timing {
    double ms;      /* median per run, by `clock` */
    double wall_ms; /* median per run on the host clock (always measured) */
    const char *clock; /* "device" (profiling events) or "host" (no profiling time from the device) */
} tool_timing;

/* `warmup` untimed runs, then n >= 1 timed runs of fn on q. */
castle_status tool_time(cl_command_queue q, tool_run_fn fn, void *state, long warmup, long n, tool_timing *out);
/* n untimed runs of fn on q, then clFinish (tool_time's warm-up). */
castle_status tool_warm(cl_command_queue q, tool_run_fn fn, void *state, long n);
/* One timed run of fn on q (from a marker enqueued before it to clFinish): its device time in ms
   (< 0 where the device gives none) and its host wall-clock time. */
castle_status tool_time_one(cl_command_queue q, tool_run_fn fn, void *state, double *dev_ms, double *wall_ms);
/* The timing of n runs from their device and wall times (tool_time_one's; sorts both arrays): the
   device median where every run has a device time, else the wall-clock median. */
void tool_timing_of(double *dev, double *wall, size_t n, tool_timing *out);

/* The median of v[0..n-1] (sorts v); 0 for n = 0. */
double tool_median(double *v, size_t n);

/* Milliseconds of a monotonic host clock. */
double tool_now_ms(void);
/* The device clock's start of `start` and end of `end` (ns) into *t0, *t1; false where the device
   gives none: an error or a zero timestamp.  (Mesa's rusticl 22.3 reports zero for
   CL_PROFILING_COMMAND_QUEUED and small counters, not nanoseconds, for the others.) */
bool tool_device_clock(cl_event start, cl_event end, cl_ulong *t0, cl_ulong *t1);

/* A whole number in decimal digits alone (no sign, space or other character) of at most max into *v;
   false, *v unchanged, for anything else. */
bool tool_parse_whole(const char *s, unsigned long long max, unsigned long long *v);
/* Whether the comma list s has no empty element ("", ",16", "16,", "16,,32" have one). */
bool tool_list_whole(const char *s);
/* A comma list of names, each one of names[0 .. count), into sel (sel[k]: names[k] is listed).
   False, with sel unspecified, for a list of 256 characters or more, an unknown name (copied into
   bad, at most nbad - 1 characters; bad is "" otherwise), an empty element, or a list that names
   nothing (an option that would select no work is a mistake). */
bool tool_parse_names(const char *s, const char *const *names, int count, bool *sel, char *bad, size_t nbad);

#endif
