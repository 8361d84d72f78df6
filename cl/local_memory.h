/* local_memory.h: the local memory (in floats) each kernel family needs under a tuning.
 *
 * Plain preprocessor arithmetic, valid C and OpenCL C: host/tuning.c includes this file to check a
 * tuning against the device (tools/castle-tune.c to count micro-tiles), and host/program.c puts it in
 * front of every program, where the kernels
 * size their __local arrays with the same macros.  b = BLK (block rows), c = DT (columns of d per
 * step), dmax = CASTLE_MAX_HEAD_DIM. */
#ifndef CASTLE_LOCAL_MEMORY_H
#define CASTLE_LOCAL_MEMORY_H

#define CASTLE_LM_MAX_(x, y) ((x) > (y) ? (x) : (y))
#define CASTLE_LM_MIN_(x, y) ((x) < (y) ? (x) : (y))
#define CASTLE_LM_UP_(x, c) (((x) + (c) - 1) / (c) * (c)) /* x rounded up to a multiple of c */

/* cl/forward.cl.  Phase 1: five k-major tiles of c columns (QC, QU, KC, KU, and D or VU), row stride
   b + 4 (common.cl KS).  Phases 2-5: G^T, X^T and the scores (transposed), the per-row alpha and l,
   two row-major tiles (VC, VU). */
#define CASTLE_LM_FORWARD(b, c) CASTLE_LM_MAX_(5 * ((b) + 4) * (c), 3 * (b) * (b) + 2 * (b) + 2 * (b) * (c))

/* cl/backward.cl (its LM_BW): eight b x b matrices, seven b x c tiles, two rows. */
#define CASTLE_LM_BACKWARD(b, c) (8 * (b) * (b) + 7 * (b) * (c) + 2 * (b))

/* cl/causal.cl.  The forward: a transposed tile CC_TROWS = min(dmax, 4 (b + c)) columns wide and a
   d chunk beside it.  The backward: a staging area CC_ST columns wide, room for four d-wide tiles
   (4 dmax) as far as it stays within cl/backward.cl's need (6 b + 7 c - 1 columns: then the whole
   is b (8 b + 7 c + 2) floats, CASTLE_LM_BACKWARD, so this family never raises CASTLE_LM_ANY).
   Each kernel adds at most 2 b^2 + 3 b floats.  CASTLE_LM_CAUSAL_FORWARD: the forward alone, as
   built under the forward's own d chunk (host/program.c, CASTLE_FAMILY_CAUSAL_FORWARD).  These are
   the needs of a program for every head (dmax, CASTLE_MAX_HEAD_DIM), which the host checks; a
   program for heads of at most dcls columns (a head-dimension class, cl/common.cl's DACC) takes
   no more than such heads use, with the same staging steps: a forward tile no wider than Q^T, K and
   V need together, 3 D - c columns beside the chunk (D: dcls rounded up to c), and a backward
   staging area no wider than four d-wide tiles, 4 D (the _CLASS forms; at b = 32, class 64: the
   forward at c = 32 30 KiB instead of 42, the backward's two kernels at c = 16 6 KiB less). */
#define CASTLE_LM_CAUSAL_TROWS(b, c, dmax) CASTLE_LM_MIN_(4 * ((b) + (c)), dmax)
#define CASTLE_LM_CAUSAL_TROWS_CLASS(b, c, dmax, dcls)                                                  \
    CASTLE_LM_MIN_(CASTLE_LM_CAUSAL_TROWS(b, c, dmax), 3 * CASTLE_LM_UP_(dcls, c) - (c))
#define CASTLE_LM_CAUSAL_ST(b, c, dmax) CASTLE_LM_MIN_(4 * (dmax), 6 * (b) + 7 * (c) - 1)
#define CASTLE_LM_CAUSAL_ST_CLASS(b, c, dmax, dcls)                                                    \
    CASTLE_LM_MIN_(CASTLE_LM_CAUSAL_ST(b, c, dmax), 4 * CASTLE_LM_UP_(dcls, c))
#define CASTLE_LM_CAUSAL(b, c, dmax)                                                                   \
    ((b) * (CASTLE_LM_MAX_(CASTLE_LM_CAUSAL_TROWS(b, c, dmax) + (c), CASTLE_LM_CAUSAL_ST(b, c, dmax)) + 2 * (b) + 3))
#define CASTLE_LM_CAUSAL_FORWARD(b, c, dmax) ((b) * (CASTLE_LM_CAUSAL_TROWS(b, c, dmax) + (c) + 2 * (b) + 3))

/* Not a size, but shared the same way: partials per new row that one work-group of g work-items of
   castle_causal_decode (cl/causal.cl) leaves, under the tuning's decode mapping dec. */
#define CASTLE_CAUSAL_DECODE_PARTIALS(g, dec) ((dec) == 1 ? (g) : 1)

/* Not a size either: the micro-tiles (tm rows x mc columns each) of a rows x cols product, which
   the nt work-items of a group share out (cl/common.cl's FUPT and FUPC; castle-tune's --max-tiles). */
#define CASTLE_MT_TILES(rows, cols, tm, mc) (((rows) / (tm)) * ((cols) / (mc)))

/* Nor these: cl/backward.cl's slab, the columns of d over which it shares out the micro-tiles of its
   d-wide products (b rows each) among its nt work-items: the d chunk c, or where c gives them less
   than one tm x mc micro-tile each, the width that gives them one, nt tm mc / b (powers of two).  A
   slab wider than c needs the backward's phase D1 to take b columns per step, which it does where
   five b x b tiles fit beside the matrices it reads (CASTLE_BW_D1_WIDE; then every phase's step is
   at least b columns wide); host/tuning.c refuses a backward shape that needs it elsewhere. */
#define CASTLE_BW_SLAB(b, c, nt, tm, mc) ((nt) * (tm) * (mc) / (b) > (c) ? (nt) * (tm) * (mc) / (b) : (c))
#define CASTLE_BW_D1_WIDE(b, c) ((c) < (b) && 7 * (c) >= 3 * (b))

/* The most any family needs: what a tuning must fit.  fc: the forwards' own d chunk (tuning
   fdchunk: the CASTLE and the causal forward); cl/cache.cl's prefill pass stays within
   CASTLE_LM_FORWARD(b, c). */
#define CASTLE_LM_ANY(b, c, fc, dmax)                                                                  \
    CASTLE_LM_MAX_(CASTLE_LM_MAX_(CASTLE_LM_MAX_(CASTLE_LM_FORWARD(b, c), CASTLE_LM_FORWARD(b, fc)),    \
                                  CASTLE_LM_CAUSAL_FORWARD(b, fc, dmax)),                              \
                   CASTLE_LM_MAX_(CASTLE_LM_BACKWARD(b, c), CASTLE_LM_CAUSAL(b, c, dmax)))

#endif
