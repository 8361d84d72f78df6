/* Loop budgets.  Mesa's llvmpipe (rusticl and Clover; Mesa 22.3) ends every loop of a work-item once
 * that work-item's loops have iterated 65535 times in all, counting every pass of every loop its
 * compiler did not unroll (gallivm's LP_MAX_TGSI_LOOP_ITERATIONS, a guard against endless shaders),
 * and says nothing: the kernel completes with part of its work undone.  Where the count grows with
 * the problem the library keeps under the limit: the folded wavefront is not used (host/schedule.c),
 * the decodes spread their rows and the causal forward its keys over more work-groups (host/cache.c,
 * host/causal.c), the causal backward and the ragged prefill's U pass run their loops in ranges over
 * several launches (castle__loops_span), and what still does not fit (a decode call whose tokens
 * alone pass the limit, or a limit below one block) is refused with CASTLE_ERR_DEVICE_UNSUPPORTED
 * before anything is enqueued.
 *
 * The counts below are upper bounds of what was measured on llvmpipe (Mesa 22.3.6, LLVM 15) under
 * its built-in tuning entry (rusticl-llvmpipe: block 16, 64 work-items, 2 x 2 scalar tiles): each
 * kernel was built with a final loop that counts the iterations left to it, at two problem sizes
 * per head dimension 16 .. 256, and the count is linear in the blocks, keys or rows a work-item
 * takes (docs/performance.md, "Loop budgets on llvmpipe", has the numbers).  c = ceil(d / 16). */
#include "loops.h"
#include "device.h"
#include "error.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

castle_status castle__loop_limit(const castle_device_info *info, unsigned long *limit)
{
    return castle__env_whole("CASTLE_LOOP_LIMIT", "loop iterations per work-item; 0: no limit",
                             strstr(info->name, "llvmpipe") ? CASTLE_LLVMPIPE_LOOP_LIMIT : 0, limit);
}

/* Per kernel: iterations once per work-item (base), then per unit: (a + b c) / div. */
static const struct {
    size_t base, a, b, div;
} model[CASTLE_LOOPS_KERNELS] = {
    [CASTLE_LOOPS_CAUSAL_FORWARD] = {200, 10, 23, 1},  /* measured 33 + 12 (c - 1) to c = 4; 180, 356 at c = 8, 16 */
    [CASTLE_LOOPS_CAUSAL_KV] = {800, 20, 60, 1},       /* 76, 120, 164, 246 (c = 1..4), 469, 912 */
    [CASTLE_LOOPS_CAUSAL_Q] = {400, 10, 30, 1},        /* 37, 53, 69, 123, 225, 439 */
    [CASTLE_LOOPS_CAUSAL_DECODE] = {200, 625, 6, 100}, /* per key and new row: 5.5 (c <= 4), 5.75, 6.25 */
    [CASTLE_LOOPS_PREFILL_U] = {800, 20, 60, 1},       /* as the key side of the causal backward (below) */
    [CASTLE_LOOPS_DECODE_ROW] = {200, 85, 3, 100},     /* per row: 0.84, 0.91, 1.03, 1.28 (d = 16..256) */
};
/* castle_cache_decode_attend also loops once per token before its rows (about 33 measured). */
#define DECODE_PER_TOKEN 64u

static size_t add_sat(size_t x, size_t y) { return x > SIZE_MAX - y ? SIZE_MAX : x + y; }
static size_t mul_sat(size_t x, size_t y) { return y && x > SIZE_MAX / y ? SIZE_MAX : x * y; }

/* Kernel k's iterations per unit at head dimension d, times model[k].div. */
static size_t per_unit(castle_loop_kernel k, size_t d) { return model[k].a + model[k].b * ((d + 15) / 16); }

size_t castle__loops(castle_loop_kernel k, size_t d, size_t units, size_t tokens)
{
    size_t n = add_sat(model[k].base, mul_sat(units, per_unit(k, d)) / model[k].div + 1);
    if (k == CASTLE_LOOPS_DECODE_ROW)
        n = add_sat(n, mul_sat(tokens, DECODE_PER_TOKEN));
    return n;
}

size_t castle__loops_max_units(castle_loop_kernel k, size_t d, size_t tokens, unsigned long limit)
{
    const size_t fixed =
        add_sat(model[k].base + 1, k == CASTLE_LOOPS_DECODE_ROW ? mul_sat(tokens, DECODE_PER_TOKEN) : 0);
    return limit > fixed ? (size_t)(limit - fixed) * model[k].div / per_unit(k, d) : 0;
}

size_t castle__loops_span(castle_loop_kernel k, size_t d, size_t units, unsigned long limit)
{
    if (!limit || castle__loops(k, d, units, 0) <= limit)
        return units;
    const size_t most = castle__loops_max_units(k, d, 0, limit);
    return most < units ? most : units;
}

castle_status castle__loops_ranges(castle_loop_kernel k, size_t d, size_t units, unsigned long limit, size_t block,
                                   const char *fn, const char *kernel, size_t *span)
{
    *span = castle__loops_span(k, d, units, limit);
    if (*span) /* else one unit does not fit either: the check below refuses */
        return CASTLE_SUCCESS;
    return castle__loop_check(limit, fn, kernel, castle__loops(k, d, 1, 0),
                              "not even one block of %zu rows at d = %zu fits", block, d);
}

castle_status castle__loop_check(unsigned long limit, const char *fn, const char *kernel, size_t iterations,
                                 const char *advice_fmt, ...)
{
    if (!limit || iterations <= limit)
        return CASTLE_SUCCESS;
    char advice[160];
    va_list ap;
    va_start(ap, advice_fmt);
    vsnprintf(advice, sizeof advice, advice_fmt, ap);
    va_end(ap);
    return castle__fail(CASTLE_ERR_DEVICE_UNSUPPORTED,
                        "%s: %s would loop about %zu times in a work-item; this device ends a work-item's loops "
                        "after %lu (Mesa's llvmpipe, or CASTLE_LOOP_LIMIT), silently, so it is refused: %s",
                        fn, kernel, iterations, limit, advice);
}
