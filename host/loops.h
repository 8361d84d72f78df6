/* Devices whose compiler ends a work-item's loops after a fixed number of iterations (host/loops.c):
 * the counts of the kernels whose loops grow with the problem, how much of its loop one launch may
 * give a work-item, and the check that refuses a launch that would still be cut short.  On every other
 * device these give everything to one launch and pass at no cost. */
#ifndef CASTLE_HOST_LOOPS_H
#define CASTLE_HOST_LOOPS_H

#include "castle/castle.h"

#include <stddef.h>

struct castle_device_info;

/* Mesa's llvmpipe (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS). */
#define CASTLE_LLVMPIPE_LOOP_LIMIT 65535u

/* The device's loop limit: CASTLE_LOOP_LIMIT when it is set (a whole number; 0: none), else 65535
   for Mesa's llvmpipe (rusticl and Clover), else 0 (none).  A malformed CASTLE_LOOP_LIMIT is an
   error. */
castle_status castle__loop_limit(const struct castle_device_info *info, unsigned long *limit);

/* The kernels whose work-items loop more as the problem grows. */
typedef enum castle_loop_kernel {
    CASTLE_LOOPS_CAUSAL_FORWARD, /* castle_causal_forward: per key block a work-group takes */
    CASTLE_LOOPS_CAUSAL_KV,      /* castle_causal_backward_kv: per query block */
    CASTLE_LOOPS_CAUSAL_Q,       /* castle_causal_backward_q: per key block */
    CASTLE_LOOPS_CAUSAL_DECODE,  /* castle_causal_decode: per key of a work-group's range */
    CASTLE_LOOPS_PREFILL_U,      /* castle_cache_prefill_u: per key block */
    CASTLE_LOOPS_DECODE_ROW,     /* castle_cache_decode_attend: per token and cache row */
    CASTLE_LOOPS_KERNELS
} castle_loop_kernel;

/* The loop iterations of one work-item of kernel k at head dimension d over `units` of its loop
   (key or query blocks, keys, or for CASTLE_LOOPS_DECODE_ROW, rows summed over the tokens, with
   `tokens` the tokens); an upper bound, saturating at SIZE_MAX. */
size_t castle__loops(castle_loop_kernel k, size_t d, size_t units, size_t tokens);

/* The most units of kernel k one work-item may loop over within limit, with `tokens` tokens for
   CASTLE_LOOPS_DECODE_ROW. */
size_t castle__loops_max_units(castle_loop_kernel k, size_t d, size_t tokens, unsigned long limit);

/* The units of kernel k at head dimension d (not CASTLE_LOOPS_DECODE_ROW) that one launch may give a
   work-item: all `units` when they fit the limit (or there is none), else as many as fit; 0 when not
   even one does.  The kernels that take their loop's range as arguments run in launches of this
   many. */
size_t castle__loops_span(castle_loop_kernel k, size_t d, size_t units, unsigned long limit);

/* castle__loops_span for a kernel that takes its loop's range (host/launch.c, castle__launch_ranges)
   over `units` blocks of `block` rows, into *span; CASTLE_ERR_DEVICE_UNSUPPORTED from fn naming kernel
   when not even one block fits. */
castle_status castle__loops_ranges(castle_loop_kernel k, size_t d, size_t units, unsigned long limit, size_t block,
                                   const char *fn, const char *kernel, size_t *span);

/* CASTLE_SUCCESS when `iterations` fit the context's loop limit, else CASTLE_ERR_DEVICE_UNSUPPORTED
   with a message from fn naming the kernel, its count and the advice (what fits) that advice_fmt and
   the arguments after it format, only then. */
castle_status castle__loop_check(unsigned long limit, const char *fn, const char *kernel, size_t iterations,
                                 const char *advice_fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;

#endif
