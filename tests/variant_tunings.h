/* The tunings other than the built-in table's entries that the test suites run the kernels under
   (the variants cases, label variants), declared once: tests/kernel_lint.c compiles every program
   they build under clang's warnings, as it does the built-in entries'. */
#ifndef CASTLE_TESTS_VARIANT_TUNINGS_H
#define CASTLE_TESTS_VARIANT_TUNINGS_H

#include "castle/castle.h"

/* clang-format off */
#define TUNING(...) {.struct_size = sizeof(castle_tuning), __VA_ARGS__}
/* clang-format on */

/* test_forward's table (test_tunings, test_nonfinite_row; test_causal takes the last).  Other
   tunings (block, threads, dchunk, vector, micro-tile) pass the same conformance checks: every kernel
   variant the tuner may pick is a correct one: the CPU mapping's vector widths (16, 8, 4; the CPU
   entries' 16 x 4 tiles run in every suite), scalar register tiles (1 x 1 on 1024 work-items, 2 x 2,
   the former GPU entry, and 4 x 4), and the GPU entry, whose backward runs its own work-group size
   and micro-tile rows (bthreads, btm; also on 2 x 4 tiles, which take slabs of d wider than dchunk)
   and its forward its own work-group size and d chunk (fthreads, fdchunk: more than threads and
   dchunk there, fewer in the last row).  Both staging orders (stage 1 under vector > 1, stage 2 under
   decode = 2) and both accumulator kinds (accum 1 and 2, as derived) run, folded (fold = 1024) and
   not.  Each tuning costs a cold build of two programs (a minute or more on PoCL): the list keeps one
   of each kind. */
static const castle_tuning variant_tunings[] = {
    /* dchunk = 32: the backward's phase D1 takes 64 columns per step over two matrices' places,
       read row-major under 16-wide vectors (BW_D1_WIDE, MT_AM_ROWS) */
    TUNING(.block = 64, .threads = 64, .dchunk = 32, .vector = 16, .tm = 1, .tn = 1),
    TUNING(.block = 8, .threads = 8, .dchunk = 8, .vector = 8, .tm = 1, .tn = 1, .fold = 1024),
    TUNING(.block = 32, .threads = 1024, .dchunk = 32, .vector = 1, .tm = 1, .tn = 1),
    TUNING(.block = 32, .threads = 128, .dchunk = 16, .vector = 1, .tm = 2, .tn = 2), /* the former GPU entry */
    TUNING(.block = 16, .threads = 16, .dchunk = 16, .vector = 1, .tm = 4, .tn = 4, .fold = 1024),
    /* the GPU entry before 2026-11-29: the backward on its own shape (128 work-items, 1 x 4 tiles),
       the forward on 128 work-items staging 32 columns */
    TUNING(.block = 32, .threads = 64, .dchunk = 16, .vector = 4, .tm = 2, .tn = 1, .decode = 2, .bthreads = 128,
           .btm = 1, .fthreads = 128, .fdchunk = 32),
    /* the GPU entry: the same with the backward on 2 x 4 tiles; 128 of them fill a 32 x 32 slab of
       its d-wide products, which it then takes instead of dchunk's 32 x 16 (CASTLE_BW_SLAB) */
    TUNING(.block = 32, .threads = 64, .dchunk = 16, .vector = 4, .tm = 2, .tn = 1, .decode = 2, .bthreads = 128,
           .btm = 2, .fthreads = 128, .fdchunk = 32),
    TUNING(.block = 32, .threads = 128, .dchunk = 32, .vector = 4, .tm = 1, .tn = 1, .bthreads = 32, .btm = 4,
           .fthreads = 64, .fdchunk = 8),
    /* 2 x 2 tiles of 8-wide vectors, folded: PoCL 3.1 crashed in the folded forward's code under
       such tiles while its loops over k and j were nested (cl/forward.cl) */
    TUNING(.block = 32, .threads = 32, .dchunk = 32, .vector = 8, .tm = 2, .tn = 2, .fold = 1024),
};
enum { VARIANT_TUNINGS = sizeof variant_tunings / sizeof variant_tunings[0] };

/* test_forward's test_sums_ignore_chunks: tunings that differ only in their chunks of d, their
   micro-tiles' rows and their work-group sizes (block 16, so that all fit 32 KiB of local memory). */
static const castle_tuning sum_tunings[3] = {
    TUNING(.block = 16, .threads = 16, .dchunk = 8, .vector = 4, .tm = 2, .tn = 1, .fthreads = 16, .fdchunk = 16),
    TUNING(.block = 16, .threads = 16, .dchunk = 16, .vector = 4, .tm = 2, .tn = 1, .fthreads = 16, .fdchunk = 8),
    TUNING(.block = 16, .threads = 16, .dchunk = 16, .vector = 4, .tm = 1, .tn = 1, .bthreads = 32, .btm = 2,
           .fthreads = 64, .fdchunk = 16),
};

#endif
