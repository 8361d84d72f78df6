/* common.cl: definitions shared by every libcastle kernel family.
 *
 * Tunables arrive as -D options from the host (host/tuning.c); each has a default here so that
 * every .cl file compiles on its own with any OpenCL C 1.2 compiler.
 * Never build with -cl-fast-relaxed-math or -cl-finite-math-only: -INFINITY is the score mask. */

#ifndef BLK
#define BLK 32          /* rows per block (docs/algorithm.md section 3) */
#endif
#ifndef NT
#define NT 128          /* work-items per work-group; multiple of BLK; NT x TM x TN x VW divides BLK*BLK, BLK*DT */
#endif
#ifndef DT
#define DT 32           /* columns of d staged through local memory per step */
#endif
#ifndef VW
#define VW 8            /* SIMD width of a micro-tile column vector: 1, 4, 8 or 16 */
#endif
#ifndef TM
#define TM 1            /* rows of a work-item's micro-tile: 1, 2, 4 or 8; divides BLK */
#endif
#ifndef TN
#define TN 1            /* vectors per micro-tile row: 1, 2, 4 or 8; TN x VW divides BLK and DT */
#endif

#ifndef STG
#define STG 2           /* how work-items share a tile's copy: 1 contiguous runs (CPUs), 2 interleaved */
#endif
#ifndef DEC
#define DEC 2           /* decode mapping: 1 a work-item per cache row (SIMD CPUs), 2 teams per row (GPUs) */
#endif

/* Where the kernels that keep d-wide rows in private arrays (the causal forward and backward, the
   decodes) hold them, by the tuning's accum (ACC).  1 (CPUs): arrays for the widest head
   (CASTLE_MAX_HEAD_DIM), indexed at run time; one program serves every d, and the slab loops stay
   rolled (PoCL keeps the values of an unrolled loop alive across its barrier regions: 1.6x the time
   of the causal forward's P V loop).  2 (GPUs): the host builds those families for the head-dimension
   class of the call, CASTLE_HEAD_DIM_CLASS >= d (host/program.c), and the slab loops are unrolled
   (ACC_UNROLL), so every index into the arrays is a constant and they stay in registers (an array
   indexed at run time goes to the stack on GPUs: 608 bytes of it per work-item in the causal forward
   on NVIDIA's sm_90, docs/performance.md). */
#ifndef ACC
#define ACC 1
#endif
#ifndef CASTLE_HEAD_DIM_CLASS /* CASTLE_MAX_HEAD_DIM comes from the host (causal.cl, cache.cl check) */
#define CASTLE_HEAD_DIM_CLASS CASTLE_MAX_HEAD_DIM
#endif
/* The float4s of each array a GPU decode pass may load into registers before its first barrier
   (cache.cl's DPRE, causal.cl's CD_PRE): a pass that would need more loads at use instead. */
#define DEC_PRE_QUADS 8
/* ACC_SKIP leaves an ACC_UNROLL loop at an iteration from which on none has work (a lane's quads
   past d, a pass's rows past the last): break where the loop stays a loop (ACC == 1), continue where
   it is unrolled (ACC == 2), since a break keeps clang from unrolling the loop fully, and the
   private arrays it indexes then go to the stack (the CASTLE decode's prefetched rows: a 400-byte
   stack frame in clang's PTX, docs/performance.md). */
#if ACC == 2
#define DACC CASTLE_HEAD_DIM_CLASS /* the widest head the private arrays hold */
#define ACC_UNROLL _Pragma("unroll")
#define ACC_SKIP continue
#else
#define DACC CASTLE_MAX_HEAD_DIM
#define ACC_UNROLL
#define ACC_SKIP break
#endif

/* Every __local array of the kernels is declared LM_ALIGNED: 16-byte aligned under the GPU
   mappings (VW <= 4).  vloadn and vstoren need only a float's alignment, so on a __local float *
   whose alignment it cannot prove a GPU compiler splits a vload4 into four scalar loads (PTX's
   ld.shared.v4 needs 16 bytes).  With the arrays aligned, it can prove the alignment of most vector
   accesses from their offsets (multiples of four floats), and the micro-tiles' fragments (mt_frag_a,
   mt_frag_b) are typed vector loads under VW = 4.  clang's NVPTX back end, GPU entry: 203 -> 70
   ld.shared instructions in the forward, 1223 -> 371 in the backward (tools/ptx-report.sh, its lds
   column; docs/performance.md).  Results are bitwise the same: only the width of the loads changes.
   Under the CPU mappings the arrays are declared as before, so that their code is the same. */
#if VW <= 4
#define LM_ALIGNED __attribute__((aligned(16)))
#else
#define LM_ALIGNED
#endif
/* The same promise for a pointer parameter to such an array (FOLD_PAIR below), where a compiler
   that knows clang's align_value attribute can use it (others ignore the promise: wider loads
   only where they can prove it). */
#if VW <= 4 && defined(__has_attribute)
#if __has_attribute(align_value)
#define LM_ALIGNED_PARAM __attribute__((align_value(16)))
#endif
#endif
#ifndef LM_ALIGNED_PARAM
#define LM_ALIGNED_PARAM
#endif

/* The block pair of the folded backward (castle_backward_fold: one work-group walks every pair of
   its batch entry and head) is a function call, not inlined into the kernel's loops over the pairs:
   inlined, the compiler hoists the pair's loop-invariant addresses and offsets out of those loops,
   and they stay live through the whole pair.  clang's PTX, GPU entry (sm_90): 255 registers, a
   32-byte stack frame and 48 bytes of spill stores inlined; 168 and none as a call, the count of
   castle_backward_block.  The pair's local memory arrives as a parameter declared LM_ALIGNED_PARAM,
   so that its vector loads stay as wide as inlined.  The same floats either way: a call changes
   which values stay in registers, not the arithmetic.  Barriers inside a called function are
   OpenCL C 1.2 (all work-items make the same call); PoCL, rusticl and Oclgrind run them
   (test_forward's fold cases, test_oclgrind).  The folded forward stays inlined (cl/forward.cl). */
#define FOLD_PAIR __attribute__((noinline))

/* float4 q of a row of floats in global memory.  vload4 and vstore4 need only a float's alignment,
   so a GPU compiler that cannot prove more splits each into four scalar accesses (clang's NVPTX back
   end: four ld.global.f32).  gload4 (q, p, al) and gstore4 (v, q, p, al) make a typed float4 access
   at p + 4 q where al says p is 16-byte aligned (GALIGNED(p); then so is p + 4 q): every row of the
   caches and of the workspace when d is a multiple of 4, and the rows of a tensor whose base and row
   stride are multiples of 4 floats.  Elsewhere (d = 33, say) they access the four floats one by one.
   The decode kernels test a row once, outside their loops; the staging helpers (gload_part, GVLOAD,
   GVSTORE) test each vector's address, a few integer operations beside the access.
   Under the GPU mappings (VW <= 4) only; under the CPU mappings they are vload4 and vstore4 (a CPU
   loads an unaligned vector as fast).  GVLOAD and GVSTORE (below) are VLOAD and VSTORE for global
   memory, through them under float4 columns. */
#if VW <= 4
#define GALIGNED(p) ((((ulong)(p)) & 15) == 0)
inline float4 gload4(const size_t q, __global const float *p, const bool al)
{
    __global const float *a = p + 4 * q;
    if (al)
        return *(__global const float4 *)a;
    return (float4)(a[0], a[1], a[2], a[3]);
}
inline void gstore4(const float4 v, const size_t q, __global float *p, const bool al)
{
    __global float *a = p + 4 * q;
    if (al) {
        *(__global float4 *)a = v;
    } else {
        a[0] = v.x;
        a[1] = v.y;
        a[2] = v.z;
        a[3] = v.w;
    }
}
#else
#define GALIGNED(p) false
#define gload4(q, p, al) ((void)(al), vload4((q), (p)))
#define gstore4(v, q, p, al) ((void)(al), vstore4((v), (q), (p)))
#endif

#define KS (BLK + 4)    /* padded, vector-aligned row stride of a k-major BLK x DT tile (stage_cols) */

/* Dot products accumulate in VW-wide vectors and are summed across lanes once: explicit SIMD for
   CPU devices, whose compilers may not reorder a scalar float reduction; VW = 1 is plain scalar
   code (GPUs).  The summation order is fixed, so results stay bitwise reproducible. */
#if VW == 1
typedef float vfloat;
typedef int vint;
#define VTRUE 1
#define VLANES(v, t) ((t)[0] = (v))
#define VLOAD(p) (*(p))
#define VSTORE(v, p) (*(p) = (v))
inline float vsum(float v) { return v; }
#elif VW == 4
typedef float4 vfloat;
typedef int4 vint;
#define VTRUE ((vint)(-1))
#define VLANES(v, t) vstore4((v), 0, (t))
#define VLOAD(p) vload4(0, (p))
#define VSTORE(v, p) vstore4((v), 0, (p))
inline float vsum(float4 v)
{
    const float2 a = v.lo + v.hi;
    return a.x + a.y;
}
#elif VW == 8
typedef float8 vfloat;
typedef int8 vint;
#define VTRUE ((vint)(-1))
#define VLANES(v, t) vstore8((v), 0, (t))
#define VLOAD(p) vload8(0, (p))
#define VSTORE(v, p) vstore8((v), 0, (p))
inline float vsum(float8 v)
{
    const float4 a = v.lo + v.hi;
    const float2 b = a.lo + a.hi;
    return b.x + b.y;
}
#elif VW == 16
typedef float16 vfloat;
typedef int16 vint;
#define VTRUE ((vint)(-1))
#define VLANES(v, t) vstore16((v), 0, (t))
#define VLOAD(p) vload16(0, (p))
#define VSTORE(v, p) vstore16((v), 0, (p))
inline float vsum(float16 v)
{
    const float8 a = v.lo + v.hi;
    const float4 b = a.lo + a.hi;
    const float2 c = b.lo + b.hi;
    return c.x + c.y;
}
#else
#error "VW must be 1, 4, 8 or 16"
#endif
#if VW == 4
#define GVLOAD(p) gload4(0, (p), GALIGNED(p))
#define GVSTORE(v, p) gstore4((v), 0, (p), GALIGNED(p))
#else
#define GVLOAD(p) VLOAD(p)
#define GVSTORE(v, p) VSTORE(v, p)
#endif
#if (BLK % VW) != 0 || (DT % VW) != 0
#error "VW must divide BLK and DT"
#endif
/* Lane e of the result holds e (lane indices for masks). */
inline vfloat lane_index(void)
{
#if VW == 1
    return 0.0f;
#elif VW == 4
    return (float4)(0, 1, 2, 3);
#elif VW == 8
    return (float8)(0, 1, 2, 3, 4, 5, 6, 7);
#else
    return (float16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
#endif
}

#define VFALSE ((vint)0)

/* ---- Register micro-tiles (castle.h "Tuning"; CLBlast xgemm's MWI x NWI) ----------------------
   A product C = A B of a block pair is split into micro-tiles of TM rows x TN vectors of VW columns,
   one per work-item at a time, held in registers as acc[MT_E(i, j)] (i < TM, j < TN; indices are
   compile-time constants once the loops unroll).  Both operands are staged k-major in local memory:
   a[kk * as + r] is entry (r, kk) of A, b[kk * bs + c] entry (kk, c) of B, so that one step of the
   contraction loads the tile's TM values of A and TN x VW values of B as vectors, once each, and
   does TM x TN vector FMAs with them.  On a matrix unit one micro-tile can become one fragment
   (mma.sync and its kin) behind the same calls.  In forward.cl and cache.cl the loops over a
   work-item's micro-tiles (m < FUPT, FUPC) and over a tile's accumulators (e < MT_ACC) carry
   #pragma unroll: left rolled, NVIDIA's compiler kept those accumulator arrays in a stack frame.
   backward.cl's and causal.cl's are unrolled under ACC == 2 only (ACC_UNROLL, above): unrolled, PoCL
   took over 10 minutes to compile the backward under a CPU tuning of four micro-tiles per work-item
   (docs/performance.md). */
#define MT_COLS (TN * VW)  /* columns of a micro-tile */
#define MT_ACC (TM * TN)   /* vfloat accumulators of a micro-tile */
#if (BLK % TM) != 0 || (BLK % MT_COLS) != 0 || (DT % MT_COLS) != 0
#error "TM must divide BLK, TN x VW must divide BLK and DT"
#endif
/* Micro-tiles of a BLK x BLK product and of a BLK x DT slab of a d-wide output; work-item lid owns
   micro-tiles lid + m NT of each (m < FUPT, m < FUPC).  The families that use FUPC check that it is
   whole (CASTLE_CHECK_FUC); backward.cl shares its d-wide products out in slabs of its own. */
#define FU CASTLE_MT_TILES(BLK, BLK, TM, MT_COLS) /* local_memory.h */
#define FUC CASTLE_MT_TILES(BLK, DT, TM, MT_COLS)
#if (FU % NT) != 0
#error "NT x TM x TN x VW must divide BLK*BLK"
#endif
#define CASTLE_CHECK_FUC ((FUC % NT) == 0)
#define FUPT (FU / NT)
#define FUPC (FUC / NT)
/* First row and first column of micro-tile u of a matrix with ncols columns (tiles row by row). */
#define MT_ROW0(u, ncols) (((u) / ((ncols) / MT_COLS)) * TM)
#define MT_COL0(u, ncols) (((u) % ((ncols) / MT_COLS)) * MT_COLS)
/* Where a micro-tile's accumulators lie in the matrix: acc[MT_E(i, j)] holds row row0 + i and the
   VW columns from col0 + j VW of the tile at (row0, col0), so accumulator e (e < MT_ACC) is row
   MT_EROW(row0, e), columns MT_ECOL(col0, e) onwards.  Loops over e name an accumulator's place
   with MT_EROW and MT_ECOL, loops over (i, j) its index with MT_E: the layout of a tile in a
   work-item's registers is spelled here, in mt_outer and in store_tile_t.  A matrix-unit fragment
   (mma.sync's, whose elements are spread over the lanes of a warp) would redefine these three with
   the lane, and the products and store_tile_t, rather than each kernel's epilogue. */
#define MT_E(i, j) ((i) * TN + (j))
#define MT_EROW(row0, e) ((row0) + (e) / TN)
#define MT_ECOL(col0, e) ((col0) + ((e) % TN) * VW)

/* The lanes of a float2 or float4 v into x[0 .. 2) or x[0 .. 4) (functions, so that the load that
   gives v is made once, whatever the compiler's optimisation level). */
__attribute__((always_inline)) inline void mt_unpack2(float *x, const float2 v)
{
    x[0] = v.s0;
    x[1] = v.s1;
}
__attribute__((always_inline)) inline void mt_unpack4(float *x, const float4 v)
{
    x[0] = v.s0;
    x[1] = v.s1;
    x[2] = v.s2;
    x[3] = v.s3;
}

/* n consecutive floats at p into x[0 .. n), one vloadn (n = 1, 2, 4 or 8). */
#define MT_LOADN_1(x, p) ((x)[0] = (p)[0])
#define MT_LOADN_2(x, p) mt_unpack2((x), vload2(0, (p)))
#define MT_LOADN_4(x, p) mt_unpack4((x), vload4(0, (p)))
#define MT_LOADN_8(x, p) (MT_LOADN_4((x), (p)), MT_LOADN_4((x) + 4, (p) + 4))
#define MT_LOADN_(n, x, p) MT_LOADN_##n(x, p)
#define MT_LOADN(n, x, p) MT_LOADN_(n, x, p)

/* n consecutive floats at p into x[0 .. n), one load each (n = 1, 2, 4 or 8). */
#define MT_LOADS_1(x, p) ((x)[0] = (p)[0])
#define MT_LOADS_2(x, p) (MT_LOADS_1((x), (p)), (x)[1] = (p)[1])
#define MT_LOADS_4(x, p) (MT_LOADS_2((x), (p)), MT_LOADS_2((x) + 2, (p) + 2))
#define MT_LOADS_8(x, p) (MT_LOADS_4((x), (p)), MT_LOADS_4((x) + 4, (p) + 4))
#define MT_LOADS_(n, x, p) MT_LOADS_##n(x, p)
#define MT_LOADS(n, x, p) MT_LOADS_(n, x, p)

/* n consecutive floats at p into x[0 .. n) as aligned vectors (n = 1, 2, 4 or 8: a float2, one or two
   float4s): p must be aligned to min(n, 4) floats, which the fragments below are (LM_ALIGNED). */
#define MT_LOADA_1(x, p) ((x)[0] = (p)[0])
#define MT_LOADA_2(x, p) mt_unpack2((x), *(__local const float2 *)(p))
#define MT_LOADA_4(x, p) mt_unpack4((x), *(__local const float4 *)(p))
#define MT_LOADA_8(x, p) (MT_LOADA_4((x), (p)), MT_LOADA_4((x) + 4, (p) + 4))
#define MT_LOADA_(n, x, p) MT_LOADA_##n(x, p)
#define MT_LOADA(n, x, p) MT_LOADA_(n, x, p)

/* An A operand is passed as a pair (a, as): entry (r, kk) of the micro-tile's rows is a[kk * as + r]
   (k-major: a tile's rows lie next to each other).  as = 1 means instead a BLK x BLK matrix stored
   row-major, entry (r, kk) at a[r * BLK + kk] (MT_ARS: the distance between the tile's rows).
   Under SIMD vectors (VW >= 8, CPUs) the TM values of a step are TM scalar loads whichever way they
   lie, so a matrix the kernel makes in registers and uses only as an A operand is stored row-major
   (one vector store per accumulator) and read through MT_AM; under VW <= 4 the fragment is one
   vector load, so MT_AM gives the k-major copy (store_column).  Under TM = 1 a fragment is one
   value, a[0], so MT_A's as = 1 for a row-major d tile of any width reads the same either way.
   MT_AM(m, mt, row0): the A operand of rows row0.. of a BLK x BLK matrix held row-major in m
   (VW >= 8) or k-major in mt (VW <= 4); MT_AM_ROWS says which copy the kernel must write. */
#define MT_ARS(as) ((as) == 1 ? BLK : 1)
#if VW >= 8
#define MT_AM_ROWS 1
#define MT_AM(m, mt, row0) (m) + (row0) * BLK, 1
#else
#define MT_AM_ROWS 0
#define MT_AM(m, mt, row0) (mt) + (row0), BLK
#endif

/* The micro-tile's fragments at one contraction step: TM values of A (column kk), TN vectors of B.
   With wide SIMD vectors (VW >= 8, CPUs) each A value is broadcast across a vector, and loaded by
   itself a CPU compiler broadcasts it straight from memory (a load, no shuffle); one vector load of
   the TM values, then a lane shuffle per broadcast, made PoCL's forward 10% and its causal forward
   21% slower (the shuffles compete with the FMAs); B's vectors are vloadn (a k-major tile's row
   stride KS = BLK + 4 does not keep 16-float vectors aligned).  With float4 columns (VW = 4, the
   GPU entries) both fragments are typed float2 / float4 loads: a vloadn needs only a float's
   alignment, and where a GPU compiler cannot prove more from the indices it splits it into scalar
   loads (PTX: one ld.shared.f32 per float; docs/performance.md), while a typed load states it.
   With scalar columns (VW = 1) the fragments are one vloadn each (as typed loads that are only
   unpacked, compilers that do not merge loads again (Oclgrind's) would count them float by float).
   Alignment of the typed fragments: A's TM values start at a row row0 (a multiple of TM) of a
   k-major tile, B's MT_COLS at a column col0 (a multiple of MT_COLS); every tile starts a multiple
   of 4 floats into a LM_ALIGNED array, and every row stride is a multiple of 4 floats (BLK, DT, KS,
   and multiples of DT; block >= 8 and dchunk >= 4 are powers of two).  So each vector is aligned to
   its size.  test_oclgrind checks it under the GPU entry (Oclgrind reports a misaligned load as an
   error). */
#if VW >= 8
__attribute__((always_inline)) inline void mt_frag_a(float *x, __local const float *a, const int as)
{
#pragma unroll
    for (int i = 0; i < TM; ++i)
        x[i] = a[i * MT_ARS(as)];
}
#elif VW == 4
__attribute__((always_inline)) inline void mt_frag_a(float *x, __local const float *a, const int as)
{
    (void)as;
    MT_LOADA(TM, x, a);
}
#else
__attribute__((always_inline)) inline void mt_frag_a(float *x, __local const float *a, const int as)
{
    (void)as;
    MT_LOADN(TM, x, a);
}
#endif
__attribute__((always_inline)) inline void mt_frag_b(vfloat *y, __local const float *b)
{
#if VW == 1
    MT_LOADN(TN, y, b);
#elif VW == 4
    for (int j = 0; j < TN; ++j)
        y[j] = ((__local const float4 *)b)[j];
#else
    for (int j = 0; j < TN; ++j)
        y[j] = VLOAD(b + j * VW);
#endif
}

/* acc[0 .. MT_ACC) = 0. */
__attribute__((always_inline)) inline void mt_zero(vfloat *acc)
{
    for (int e = 0; e < MT_ACC; ++e)
        acc[e] = (vfloat)(0.0f);
}

/* y += x v, both fragments loaded: the TM x TN outer product of one contraction step, for the rows
   i >= i0 of the tile (i0 a compile-time constant once unrolled).  The loop runs over all TM rows and
   tests i0 inside it: a loop from i0 has no constant trip count where clang optimises this function
   before its callers' constants reach it, and it unrolled it by two at run time instead; under TM = 4
   that left the callers' accumulators indexed by a variable, so in a stack frame (clang's PTX: the
   forward's block kernel 272 bytes, the causal forward's 208; under TM = 2 the two iterations folded
   away). */
__attribute__((always_inline)) inline void mt_outer(vfloat *y, const float *x, const vfloat *v, const int i0)
{
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            if (i >= i0)
                y[MT_E(i, j)] += x[i] * v[j];
}

/* y += x b[0 .. MT_COLS): mt_outer with B's fragment loaded from b. */
__attribute__((always_inline)) inline void mt_step_from(vfloat *y, const float *x, __local const float *b,
                                                        const int i0)
{
    vfloat v[TN];
    mt_frag_b(v, b);
    mt_outer(y, x, v, i0);
}

/* One contraction step with the A fragment already loaded: acc += x b[0 .. MT_COLS). */
__attribute__((always_inline)) inline void mt_step(vfloat *acc, const float *x, __local const float *b)
{
    mt_step_from(acc, x, b, 0);
}

/* acc += sum_{0 <= kk < k1} A[:, kk] B[kk, :] for the micro-tile whose A rows start at a and B
   columns at b (k-major operands, strides as and bs): one FMA chain per accumulator, straight into
   acc, kk ascending.  So a sum's rounding depends only on the order of its terms, not on how many
   columns a call takes: cl/backward.cl's recomputed gate logits and scores, summed over other chunks
   of d than the forward's, are bitwise the forward's (and every product over d of a kernel is the same
   chain whatever its tuning's dchunk).  No partial sums beside acc: a micro-tile of TM x TN vectors
   takes TM x TN independent chains, and partial sums (the even and the odd kk apart, as the products
   once were) doubled the registers a product holds; clang's count for the backward under 2 x 4 tiles
   went from 254 to 168 without them (docs/performance.md).  Called with k1 = BLK, DT or a row0. */
__attribute__((always_inline)) inline void mt_product(vfloat *acc, __local const float *a, const int as,
                                                      __local const float *b, const int bs, const int k1)
{
    for (int kk = 0; kk < k1; ++kk) {
        float x[TM];
        mt_frag_a(x, a + kk * as, as);
        mt_step(acc, x, b + kk * bs);
    }
}

/* Two products that share an operand, each the chain mt_product takes (so bitwise its results), in
   one loop that loads the shared fragment once per step: acc1 += A B1 and acc2 += A B2 (_2b: one A, B
   operands at b1 and b2 with one stride), or acc1 += A1 B and acc2 += A2 B (_2a).  On 1 x 4 tiles of
   float4 columns: 3 local loads per 8 FMA lanes against 4 (docs/performance.md).  Used where
   MT_SHARE (VW < 8, the GPU-shaped mappings); the kernels keep their separate loops otherwise, as
   a branch `if (MT_SHARE && ...)` that the compiler removes: under SIMD vectors (VW >= 8, CPUs) the
   fragment is a scalar or a vector already in registers, and on PoCL the CPU entry's forward ran
   1.16 times slower with the loops joined.  A branch chooses around the call, never inside a
   contraction loop (which PoCL would run over its work-items with the accumulators in memory). */
#define MT_SHARE (VW < 8)
__attribute__((always_inline)) inline void mt_product_2b(vfloat *acc1, vfloat *acc2, __local const float *a,
                                                         const int as, __local const float *b1,
                                                         __local const float *b2, const int bs, const int k1)
{
    for (int kk = 0; kk < k1; ++kk) {
        float x[TM];
        mt_frag_a(x, a + kk * as, as);
        mt_step(acc1, x, b1 + kk * bs);
        mt_step(acc2, x, b2 + kk * bs);
    }
}
__attribute__((always_inline)) inline void mt_product_2a(vfloat *acc1, vfloat *acc2, __local const float *a1,
                                                         __local const float *a2, const int as,
                                                         __local const float *b, const int bs, const int k1)
{
    for (int kk = 0; kk < k1; ++kk) {
        float x1[TM], x2[TM];
        vfloat y[TN];
        mt_frag_a(x1, a1 + kk * as, as);
        mt_frag_a(x2, a2 + kk * as, as);
        mt_frag_b(y, b + kk * bs);
        mt_outer(acc1, x1, y, 0);
        mt_outer(acc2, x2, y, 0);
    }
}

/* As mt_product over a lower-triangular A whose rows and contraction index share one block: the
   micro-tile's row row0 + i takes only the terms kk <= row0 + i.  Terms above the diagonal are
   skipped, never multiplied by a zero, so nothing from a later row (a NaN, an Inf) reaches an earlier
   one; and the work above the diagonal is not done.  For finite inputs the result is bitwise that of
   mt_product over the whole block (the skipped terms are exact zeros, each the last of its row's chain). */
__attribute__((always_inline)) inline void mt_product_lower(vfloat *acc, __local const float *a, const int as,
                                                            __local const float *b, const int bs, const int row0)
{
    mt_product(acc, a, as, b, bs, row0); /* the full rows of A before the tile's diagonal */
#pragma unroll
    for (int q = 0; q < TM; ++q) { /* the diagonal: row row0 + i takes kk = row0 + q for i >= q */
        const int k = row0 + q;
        float x[TM];
        mt_frag_a(x, a + k * as, as);
        mt_step_from(acc, x, b + k * bs, q);
    }
}

/* The A operand of a product from a BLK x w tile staged by stage_tile(.., MT_AT), from its column c:
   k-major (t[c * BLK + r]) in general, so that a step loads the TM rows' values as one vector; but with
   one row per micro-tile (TM = 1, e.g. a derived CPU tuning) a step reads one value, and the tile is staged as it
   lies in memory (t[r * w + c]: a vector copy per VW floats instead of a transposition, which on PoCL
   cost as much as the products).  MT_AOFF is the offset of entry (r, c), MT_A the (pointer, stride)
   pair of mt_product's a and as; the _KS forms are for a tile staged by stage_cols(.., ks, w, ..,
   MT_AT), k-major with row stride ks. */
#if TM == 1
#define MT_AT false
#define MT_AOFF_KS(r, w, c, ks) ((r) * (w) + (c))
#define MT_A_KS(t, row0, w, c, ks) (t) + MT_AOFF_KS(row0, w, c, ks), 1
#else
#define MT_AT true
#define MT_AOFF_KS(r, w, c, ks) ((c) * (ks) + (r))
#define MT_A_KS(t, row0, w, c, ks) (t) + MT_AOFF_KS(row0, w, c, ks), (ks)
#endif
#define MT_AOFF(r, w, c) MT_AOFF_KS(r, w, c, BLK)
#define MT_A(t, row0, w, c) MT_A_KS(t, row0, w, c, BLK)

/* Lane-wise comparisons: all bits set (vectors) or 1 (scalars) where true; combine with & and |. */
#define VISLESS(a, b) isless((a), (b))
#define VISLESSEQ(a, b) islessequal((a), (b))
#define VISGREATER(a, b) isgreater((a), (b))
#define VISGREATEREQ(a, b) isgreaterequal((a), (b))

/* Lane-wise stable logistic function and SiLU (one exp, no overflow for any finite x). */
inline vfloat castle_sigmoid_v(vfloat x)
{
    const vfloat e = exp(-fabs(x));
    const vfloat r = (vfloat)(1.0f) / ((vfloat)(1.0f) + e);
    return select(e * r, r, VISGREATEREQ(x, (vfloat)(0.0f)));
}
/* SiLU(x) = x g from g = sigmoid(x), with its limit 0 at x = -inf, where x g is -inf x 0 = NaN: an
   unscaled score product (qC . D) can overflow float32 although its scaled value is finite.  x is
   raised to -FLT_MAX there (one instruction, no register more than x g: the decode kernel sits at
   its register limit); a NaN x keeps g NaN, so the result stays NaN; finite x: bitwise x g. */
inline vfloat castle_silu_g(vfloat x, vfloat g) { return fmax(x, (vfloat)(-FLT_MAX)) * g; }
inline vfloat castle_silu_v(vfloat x) { return castle_silu_g(x, castle_sigmoid_v(x)); }

/* The gate G[s, j'] = sigmoid(sc logit) of row s for the VW columns j' in jp (docs/algorithm.md
   section 2): where it is allowed (s < L, j' < L, s < j', and j' <= s + W for CASTLE-SWL), 0
   elsewhere.  The backward and the cache's gated pass compute it here, the forward (which keeps G^T)
   with castle_gate_t_v below: the same operations on the same logit, lane by lane, so every kernel
   sees bitwise the same G. */
__attribute__((always_inline)) inline vfloat castle_gate_v(const vfloat logit, const float sc, const int s,
                                                          const vfloat jp, const int L, const int W)
{
    const vfloat sf = (float)s;
    const vfloat g = select((vfloat)(0.0f), castle_sigmoid_v(sc * logit),
                            VISLESS(jp, (vfloat)(float)L) & VISLESS(sf, jp) &
                                (W == 0 ? VTRUE : VISLESSEQ(jp, sf + (float)W)));
    return s < L ? g : (vfloat)(0.0f);
}

/* castle_gate_v transposed: G[s, j'] of one column j' for the VW rows s in sv (a row of G^T). */
__attribute__((always_inline)) inline vfloat castle_gate_t_v(const vfloat logit, const float sc, const vfloat sv,
                                                            const int jp, const int L, const int W)
{
    const vfloat jf = (float)jp;
    const vfloat g = select((vfloat)(0.0f), castle_sigmoid_v(sc * logit),
                            VISLESS(sv, (vfloat)(float)L) & VISLESS(sv, jf) &
                                (W == 0 ? VTRUE : VISLESSEQ(jf, sv + (float)W)));
    return jp < L ? g : (vfloat)(0.0f);
}

/* acc += the terms kk in [0, BLK) of A[:, kk] B[kk, :] that row row0 + i and column col0 + c take:
   kk >= row0 + i + ro when ro >= 0 (no row bound when ro < 0) and kk >= col0 + c when cols.  The
   terms of the mixed region are added by select, so a masked term never reaches a sum. */
__attribute__((always_inline)) inline void mt_product_from(vfloat *acc, __local const float *a, const int as,
                                                           __local const float *b, const int bs, const int row0,
                                                           const int ro, const int col0, const bool cols,
                                                           const vfloat lane)
{
    const int kmin = max(ro >= 0 ? row0 + ro : 0, cols ? col0 : 0);
    const int kfull = min(BLK, max(ro >= 0 ? row0 + TM - 1 + ro : 0, cols ? col0 + MT_COLS - 1 : 0));
    for (int kk = kmin; kk < kfull; ++kk) {
        float x[TM];
        vfloat y[TN];
        mt_frag_a(x, a + kk * as, as);
        mt_frag_b(y, b + kk * bs);
        for (int i = 0; i < TM; ++i)
            for (int j = 0; j < TN; ++j) {
                const vint cm = cols ? VISGREATEREQ((vfloat)(float)kk, (float)(col0 + j * VW) + lane) : VTRUE;
                const vint m = (ro < 0 || kk >= row0 + i + ro) ? cm : VFALSE;
                acc[MT_E(i, j)] = select(acc[MT_E(i, j)], acc[MT_E(i, j)] + x[i] * y[j], m);
            }
    }
    const int k0 = max(kmin, kfull);
    mt_product(acc, a + k0 * as, as, b + k0 * bs, bs, BLK - k0);
}

/* acc += the terms kk < row0 + i of row row0 + i (strictly below the diagonal). */
__attribute__((always_inline)) inline void mt_product_below(vfloat *acc, __local const float *a, const int as,
                                                            __local const float *b, const int bs, const int row0)
{
    mt_product(acc, a, as, b, bs, row0);
    for (int q = 0; q + 1 < TM; ++q) { /* the diagonal: row row0 + i takes kk = row0 + q for i > q */
        float x[TM];
        mt_frag_a(x, a + (row0 + q) * as, as);
        mt_step_from(acc, x, b + (row0 + q) * bs, q + 1);
    }
}

/* acc += the terms row0 + i + lo <= kk < row0 + i + hi (and 0 <= kk < BLK) of row row0 + i: a band
   along the diagonal, such as a sliding window's, kk ascending as in mt_product; the terms outside a
   row's band are skipped, never multiplied by a zero. */
__attribute__((always_inline)) inline void mt_product_band(vfloat *acc, __local const float *a, const int as,
                                                           __local const float *b, const int bs, const int row0,
                                                           const int lo, const int hi)
{
    if (row0 + TM - 1 + lo <= 0 && row0 + hi >= BLK) {
        mt_product(acc, a, as, b, bs, BLK);
        return;
    }
    const int k0 = clamp(row0 + lo, 0, BLK), k1 = clamp(row0 + TM - 1 + hi, 0, BLK);
    for (int kk = k0; kk < k1; ++kk) {
        float x[TM];
        vfloat y[TN];
        mt_frag_a(x, a + kk * as, as);
        mt_frag_b(y, b + kk * bs);
        for (int i = 0; i < TM; ++i)
            if (kk >= row0 + i + lo && kk < row0 + i + hi)
                for (int j = 0; j < TN; ++j)
                    acc[MT_E(i, j)] += x[i] * y[j];
    }
}

/* Lane q of v to p[q s] for q < VW (VLANES_TO), lane by lane without a private array: PoCL gives
   every private array of a kernel its own copy per work-item in memory, and the copies of the
   arrays of many inlined calls made the backward's compile last minutes under vector = 4 or 16. */
#define LANES_TO_1(p, s, v) ((p)[0] = (v))
#define LANES_TO_2(p, s, v) ((p)[0] = (v).s0, (p)[s] = (v).s1)
#define LANES_TO_4(p, s, v) (LANES_TO_2((p), (s), (v).lo), LANES_TO_2((p) + 2 * (s), (s), (v).hi))
#define LANES_TO_8(p, s, v) (LANES_TO_4((p), (s), (v).lo), LANES_TO_4((p) + 4 * (s), (s), (v).hi))
#define LANES_TO_16(p, s, v) (LANES_TO_8((p), (s), (v).lo), LANES_TO_8((p) + 8 * (s), (s), (v).hi))
#define VLANES_TO__(n, p, s, v) LANES_TO_##n(p, s, v)
#define VLANES_TO_(n, p, s, v) VLANES_TO__(n, p, s, v)
#define VLANES_TO(p, s, v) VLANES_TO_(VW, p, s, v)

/* Stores the VW lanes of v as rows c, c + 1, .. of column r of a k-major BLK x BLK matrix. */
__attribute__((always_inline)) inline void store_column(__local float *m, const int c, const int r, const vfloat v)
{
    VLANES_TO(m + c * BLK + r, BLK, v);
}

/* The micro-tile acc (rows row0 + i, the VW columns from col0 + j VW: mt_product's accumulators)
   transposed into the k-major BLK x BLK matrix m (m[c * BLK + r]).  A tile's TM rows lie next to
   each other there, so each column takes one TM-wide store (TM = 2: a float2; TM >= 4: float4s)
   where store_column, an accumulator at a time, takes TM lane stores: under the GPU entries' 2 x 4
   tiles half the store instructions, and half the bank wavefronts (a warp's eight tiles of a column
   share banks either way).  The same values in the same places.  TM = 1 is store_column's.  The
   stores are typed (a vstore2 or vstore4 needs only a float's alignment, and a GPU compiler that
   cannot prove more splits it): m is 16-byte aligned (LM_ALIGNED), row0 a multiple of TM and BLK
   of 4. */
#define PAIRS_TO_1(p, s, a, b) (*(__local float2 *)(p) = (float2)((a), (b)))
#define PAIRS_TO_2(p, s, a, b) (PAIRS_TO_1((p), (s), (a).s0, (b).s0), PAIRS_TO_1((p) + (s), (s), (a).s1, (b).s1))
#define PAIRS_TO_4(p, s, a, b) (PAIRS_TO_2((p), (s), (a).lo, (b).lo), PAIRS_TO_2((p) + 2 * (s), (s), (a).hi, (b).hi))
#define PAIRS_TO_8(p, s, a, b) (PAIRS_TO_4((p), (s), (a).lo, (b).lo), PAIRS_TO_4((p) + 4 * (s), (s), (a).hi, (b).hi))
#define PAIRS_TO_16(p, s, a, b) (PAIRS_TO_8((p), (s), (a).lo, (b).lo), PAIRS_TO_8((p) + 8 * (s), (s), (a).hi, (b).hi))
#define QUADS_TO_1(p, s, a, b, c, d) (*(__local float4 *)(p) = (float4)((a), (b), (c), (d)))
#define QUADS_TO_2(p, s, a, b, c, d)                                                                           \
    (QUADS_TO_1((p), (s), (a).s0, (b).s0, (c).s0, (d).s0), QUADS_TO_1((p) + (s), (s), (a).s1, (b).s1, (c).s1, (d).s1))
#define QUADS_TO_4(p, s, a, b, c, d)                                                                           \
    (QUADS_TO_2((p), (s), (a).lo, (b).lo, (c).lo, (d).lo), QUADS_TO_2((p) + 2 * (s), (s), (a).hi, (b).hi, (c).hi, (d).hi))
#define QUADS_TO_8(p, s, a, b, c, d)                                                                           \
    (QUADS_TO_4((p), (s), (a).lo, (b).lo, (c).lo, (d).lo), QUADS_TO_4((p) + 4 * (s), (s), (a).hi, (b).hi, (c).hi, (d).hi))
#define QUADS_TO_16(p, s, a, b, c, d)                                                                          \
    (QUADS_TO_8((p), (s), (a).lo, (b).lo, (c).lo, (d).lo), QUADS_TO_8((p) + 8 * (s), (s), (a).hi, (b).hi, (c).hi, (d).hi))
#define VPAIRS_TO__(n, p, s, a, b) PAIRS_TO_##n(p, s, a, b)
#define VPAIRS_TO_(n, p, s, a, b) VPAIRS_TO__(n, p, s, a, b)
#define VQUADS_TO__(n, p, s, a, b, c, d) QUADS_TO_##n(p, s, a, b, c, d)
#define VQUADS_TO_(n, p, s, a, b, c, d) VQUADS_TO__(n, p, s, a, b, c, d)
__attribute__((always_inline)) inline void store_tile_t(__local float *m, const int row0, const int col0,
                                                        const vfloat *acc)
{
#pragma unroll
    for (int j = 0; j < TN; ++j) {
        __local float *p = m + MT_ECOL(col0, MT_E(0, j)) * BLK + row0;
#if TM == 1
        VLANES_TO(p, BLK, acc[MT_E(0, j)]);
#elif TM == 2
        VPAIRS_TO_(VW, p, BLK, acc[MT_E(0, j)], acc[MT_E(1, j)]);
#else
#pragma unroll
        for (int i = 0; i < TM; i += 4)
            VQUADS_TO_(VW, p + i, BLK, acc[MT_E(i, j)], acc[MT_E(i + 1, j)], acc[MT_E(i + 2, j)], acc[MT_E(i + 3, j)]);
#endif
    }
}

/* The first n (<= w) floats at p as a w-wide vector, zeros beyond (gload_n<w>), and the first n
   lanes of v to p (gstore_n<w>), for every width w = 1, 2, 4, 8, 16; gload_part and gstore_part
   are the VW-wide ones.  A partial row never reads or writes past its n floats; it is moved lane by
   lane without a private array (VLANES_TO says why). */
#define CASTLE_CAT_(a, b) a##b
#define CASTLE_CAT(a, b) CASTLE_CAT_(a, b)
#define CASTLE_LOAD_1(p) (*(p))
#define CASTLE_STORE_1(v, p) (*(p) = (v))
#define CASTLE_LOAD_W(w, p) CASTLE_CAT(vload, w)(0, (p))
#define CASTLE_STORE_W(w, v, p) CASTLE_CAT(vstore, w)((v), 0, (p))
#define PART_LOAD_1(p, n) ((n) > 0 ? (p)[0] : 0.0f)
#define PART_LOAD_2(p, n) ((float2)(PART_LOAD_1((p), (n)), PART_LOAD_1((p) + 1, (n) - 1)))
#define PART_LOAD_4(p, n) ((float4)(PART_LOAD_2((p), (n)), PART_LOAD_2((p) + 2, (n) - 2)))
#define PART_LOAD_8(p, n) ((float8)(PART_LOAD_4((p), (n)), PART_LOAD_4((p) + 4, (n) - 4)))
#define PART_LOAD_16(p, n) ((float16)(PART_LOAD_8((p), (n)), PART_LOAD_8((p) + 8, (n) - 8)))
#define PART_STORE_1(v, p, n) \
    if ((n) > 0)              \
    (p)[0] = (v)
#define PART_STORE_2(v, p, n)            \
    PART_STORE_1((v).s0, (p), (n));      \
    PART_STORE_1((v).s1, (p) + 1, (n) - 1)
#define PART_STORE_4(v, p, n)            \
    PART_STORE_2((v).lo, (p), (n));      \
    PART_STORE_2((v).hi, (p) + 2, (n) - 2)
#define PART_STORE_8(v, p, n)            \
    PART_STORE_4((v).lo, (p), (n));      \
    PART_STORE_4((v).hi, (p) + 4, (n) - 4)
#define PART_STORE_16(v, p, n)           \
    PART_STORE_8((v).lo, (p), (n));      \
    PART_STORE_8((v).hi, (p) + 8, (n) - 8)
#define CASTLE_PART_FNS(w, T, LOAD, STORE)                                                                          \
    inline T gload_n##w(__global const float *p, int n)                                                         \
    {                                                                                                              \
        if (n >= w)                                                                                                \
            return LOAD(p);                                                                                        \
        return PART_LOAD_##w(p, n);                                                                                \
    }                                                                                                              \
    inline void gstore_n##w(T v, __global float *p, int n)                                                      \
    {                                                                                                              \
        if (n >= w) {                                                                                              \
            STORE(v, p);                                                                                           \
            return;                                                                                                \
        }                                                                                                          \
        PART_STORE_##w(v, p, n);                                                                                   \
    }
#define CASTLE_LOAD_2(p) CASTLE_LOAD_W(2, p)
#define CASTLE_LOAD_4(p) gload4(0, (p), GALIGNED(p))
#define CASTLE_LOAD_8(p) CASTLE_LOAD_W(8, p)
#define CASTLE_LOAD_16(p) CASTLE_LOAD_W(16, p)
#define CASTLE_STORE_2(v, p) CASTLE_STORE_W(2, v, p)
#define CASTLE_STORE_4(v, p) gstore4((v), 0, (p), GALIGNED(p))
#define CASTLE_STORE_8(v, p) CASTLE_STORE_W(8, v, p)
#define CASTLE_STORE_16(v, p) CASTLE_STORE_W(16, v, p)
CASTLE_PART_FNS(1, float, CASTLE_LOAD_1, CASTLE_STORE_1)
CASTLE_PART_FNS(2, float2, CASTLE_LOAD_2, CASTLE_STORE_2)
CASTLE_PART_FNS(4, float4, CASTLE_LOAD_4, CASTLE_STORE_4)
CASTLE_PART_FNS(8, float8, CASTLE_LOAD_8, CASTLE_STORE_8)
CASTLE_PART_FNS(16, float16, CASTLE_LOAD_16, CASTLE_STORE_16)
#define gload_part CASTLE_CAT(gload_n, VW)
#define gstore_part CASTLE_CAT(gstore_n, VW)

/* for (e ...) over work-item get_local_id(0)'s share of the n items 0 .. n-1 of a copy (the vectors
   of a tile) among the nt work-items of its group, by the tuning's stage order (STG).  1: a
   contiguous run of ceil(n / nt) items each.  A CPU device runs a work-group's work-items one after
   another, so the group then reads its tile front to back, one sequential stream that the hardware
   prefetcher follows; interleaved, the loads jump nt vectors at a time and stall on memory (PoCL,
   2 cores, L = 2048: the CASTLE backward 8% faster, the forward unchanged; docs/performance.md).
   2: items lid, lid + nt, ...: consecutive work-items on consecutive vectors, one coalesced access
   per warp on a GPU. */
#if STG == 1
#define FOR_SHARE_OF(e, n, nt)                                                                            \
    for (int e##_q = 0, e##_per = ((n) + (nt) - 1) / (nt), e = (int)get_local_id(0) * e##_per;           \
         e##_q < e##_per && e < (n); ++e##_q, ++e)
#else
#define FOR_SHARE_OF(e, n, nt) for (int e = get_local_id(0); e < (n); e += (nt))
#endif
#define FOR_SHARE(e, n) FOR_SHARE_OF(e, n, NT) /* the kernels on NT work-items */

/* Software prefetch of global memory a block pair reads a phase later, under the tuning's prefetch
   = 1 (PFT): a CPU runs the work-items of a group one after another, and each load that misses the
   caches stalls it.  OpenCL's prefetch() is a no-op in PoCL, so this is clang's __builtin_prefetch,
   where the compiler has it; not every clang-based implementation can run it (Oclgrind refuses to
   create such a kernel), hence a tuning parameter that the PoCL entry sets, not a default. */
#ifndef PFT
#define PFT 0
#endif
#define CASTLE_PREFETCH 0 /* 1: PFT and the compiler has __builtin_prefetch */
#if PFT && defined(__has_builtin)
#if __has_builtin(__builtin_prefetch)
#undef CASTLE_PREFETCH
#define CASTLE_PREFETCH 1
#endif
#endif
#define CASTLE_LINE 16 /* floats per cache line that a prefetch brings (64 bytes) */

/* Prefetches rows [row0, min(row0 + BLK, nrows)) x columns [0, d) of a row-major matrix (row stride
   rs), shared out among the work-items. */
__attribute__((always_inline)) inline void prefetch_rows(__global const float *p, const ulong rs, const int row0,
                                                         const int nrows, const int d)
{
#if CASTLE_PREFETCH /* else nothing, no loop either */
    const int nl = (d + CASTLE_LINE - 1) / CASTLE_LINE; /* lines per row */
    FOR_SHARE(e, BLK * nl) {
        const int r = e / nl;
        if (row0 + r < nrows)
            __builtin_prefetch(p + (ulong)(row0 + r) * rs + (e - r * nl) * CASTLE_LINE);
    }
#endif
}

/* Rows [row0, row0 + BLK) x columns [c0, c0 + w) of a row-major matrix (row stride rs) into local
   memory, entry (r, c) at t[r * rstride + c * cstride]; rows >= nrows and columns >= d read as 0, so a
   ragged block never reads past its tensor; w is a multiple of VW.  A work-item moves VW columns of a
   row with one vector load (the vectors shared out by FOR_SHARE), and
   a row-major destination (cstride 1) takes them with one vector store: on a CPU device the staging
   costs a few instructions per vector instead of per float (float by float, it cost PoCL's forward
   40% of its time and the backward more than its products).  With VW = 1, one float per step.
   A transposing copy (cstride > 1) stores each vector's VW lanes cstride floats apart.  Shared out
   row by row, a warp's 32 work-items take 32 / nv rows, and with cstride a multiple of 32 (BLK) a
   lane store of theirs puts each row's nv words in one of a GPU's 32 banks: 16 wavefronts for one
   request at nv = 16, where a conflict-free one takes one (tools/oclgrind-banks.sh counts them).
   Under the GPU-shaped mappings (VW <= 4) with stage order 2 the items go instead in blocks of 32
   consecutive ones, CT_ROWS = 16 rows x CT_VECS = 2 vectors (8 x 4 when BLK = 8; where a row has a
   multiple of CT_VECS vectors).  A lane store of a warp then puts its 16 rows in 16 consecutive
   banks, and the two vectors' words 4 cstride apart: the same banks at stride BLK (2 wavefronts),
   the other 16 at KS = BLK + 4 (4 KS = 16 modulo 32: one wavefront, conflict-free).  8 x 4 took
   4 and 2.  Its loads read 2 VW contiguous floats of each row: whole 32-byte sectors when VW = 4.
   The same values go to the same places either way. */
#if STG == 2 && VW <= 4
#define CT_BLOCKS 1
#else
#define CT_BLOCKS 0
#endif
#if BLK % 16 == 0
#define CT_ROWS 16
#else
#define CT_ROWS 8
#endif
#define CT_VECS (32 / CT_ROWS)
__attribute__((always_inline)) inline void copy_tile(__local float *t, const int rstride, const int cstride,
                                                     __global const float *p, ulong rs, int row0, int nrows,
                                                     int c0, int w, int d)
{
    const int nv = w / VW; /* vectors per row */
    const bool blocks = CT_BLOCKS && cstride != 1 && nv % CT_VECS == 0;
    FOR_SHARE(e, BLK * nv) {
        int r, c;
        if (blocks) { /* 32 consecutive items: CT_ROWS rows x CT_VECS vectors */
            const int g = e / (CT_ROWS * CT_VECS), l = e % (CT_ROWS * CT_VECS);
            r = (g % (BLK / CT_ROWS)) * CT_ROWS + l % CT_ROWS;
            c = ((g / (BLK / CT_ROWS)) * CT_VECS + l / CT_ROWS) * VW;
        } else {
            r = e / nv;
            c = (e - r * nv) * VW;
        }
        const vfloat x = row0 + r < nrows ? gload_part(p + (ulong)(row0 + r) * rs + c0 + c, d - c0 - c)
                                          : (vfloat)(0.0f);
        if (cstride == 1) {
            VSTORE(x, t + r * rstride + c);
        } else {
            VLANES_TO(t + c * cstride + r * rstride, cstride, x);
        }
    }
}

/* Columns [c0, c0 + n) of rows [row0, row0 + BLK) of a row-major matrix into a tile laid out w
   columns wide (n <= w, both multiples of VW): k-major with row stride ks (t[c * ks + r], trans: VW
   consecutive rows of a column then load as one vector) or row-major (t[r * w + c]).  The layout is
   the phase's (ks and w constants), the columns staged the step's (the CASTLE backward's phases stage
   the last, ragged step of d narrower than their layout).  A k-major tile is written by transposing
   stores (copy_tile says how they meet a GPU's banks; with ks = KS = BLK + 4 they spread further). */
__attribute__((always_inline)) inline void stage_cols(__local float *t, const int ks, const int w,
                                                      __global const float *p, ulong rs, int row0, int nrows,
                                                      int c0, int n, int d, const bool trans)
{
    if (trans)
        copy_tile(t, 1, ks, p, rs, row0, nrows, c0, n, d);
    else
        copy_tile(t, w, 1, p, rs, row0, nrows, c0, n, d);
}

/* A BLK x w tile, all w columns staged, with the unpadded k-major stride BLK. */
inline void stage_tile(__local float *t, __global const float *p, ulong rs, int row0, int nrows, int c0, int w,
                       int d, const bool trans)
{
    stage_cols(t, BLK, w, p, rs, row0, nrows, c0, w, d, trans);
}

/* The batch entry x head of a work-item: every launch puts them on dimension 1, one work-item deep,
   and the host cuts that dimension into launches of at most 65535 work-groups (host/launch.c: what a
   CUDA grid holds in y), passing each launch's first as every kernel's last argument, bh0 (not as a
   global offset: clang's libclc for NVPTX, with which tools/ptx-report.sh compiles, has no
   get_global_offset, and get_global_id(1) cost castle_cache_decode_attend a spill there). */
#define BH0_PARAM const int bh0
#define BH_INDEX (bh0 + (int)get_group_id(1))

/* Element offset of (batch b, head h, row r) for strides s = (batch, head, row, unused). */
inline ulong tensor_offset(ulong4 s, uint b, uint h, uint r)
{
    return (ulong)b * s.x + (ulong)h * s.y + (ulong)r * s.z;
}

/* Block-transposed copies of the inputs.  The block kernels read most d tiles k-major (the
   contraction index first: the B operand of every Q K^T-like product, and the A operands when
   MT_AT), which staged from a row-major tensor is a transposition per block pair: with VW > 1, VW
   single-lane stores per vector, 11% of PoCL's forward and 9% of its backward.  Instead, one launch
   of castle_transpose_blocks before a pass writes each such input once into the workspace region
   ws_t, block by block: block n of the copy of batch entry x head bh holds x[n BLK + r][c] at
   (n d + c) BLK + r (rows >= L are zeros), and the kernels stage k-major tiles from it with vector
   copies (stage_tile_t).  The copy of input slot q (CASTLE_T_*) of bh starts at
   ws_t.x + q ws_t.y + bh Lpad d (ws_t.y = BH Lpad d, BH batch entries x heads: the region's slots
   one after the other, so that a forward's workspace holds the first CASTLE_WS_T_FORWARD).  The
   forward fills slots 0-3 and the backward slots 4-6, reading 0-3 as the forward left them (its
   inputs are the forward's: the D and X it reads depend on them too); host/schedule.c passes the
   inputs in this order. */
#define CASTLE_T_QU 0
#define CASTLE_T_KU 1
#define CASTLE_T_QC 2
#define CASTLE_T_KC 3
#define CASTLE_T_VU 4
#define CASTLE_T_VC 5
#define CASTLE_T_DO 6

/* The block-transposed copy of slot q for batch entry x head bh. */
inline __global float *tcopy(__global float *ws, const ulong2 ws_t, const int q, const int bh, const int Lpad,
                             const int d)
{
    return ws + ws_t.x + (ulong)q * ws_t.y + (ulong)bh * Lpad * d;
}

/* Columns [c0, c0 + w) of block n of a block-transposed copy xt as a k-major tile t[c * ks + r];
   columns >= d read as 0.  One vector load and store per VW rows (FOR_SHARE; under stage order 2
   consecutive work-items on consecutive rows: coalesced on a GPU, and no bank conflicts). */
__attribute__((always_inline)) inline void stage_tile_t(__local float *t, const int ks, __global const float *xt,
                                                        const int n, const int c0, const int w, const int d)
{
    const int nv = BLK / VW; /* vectors per column */
    FOR_SHARE(e, w * nv) {
        const int c = e / nv, r = (e - c * nv) * VW;
        const vfloat x = c0 + c < d ? GVLOAD(xt + ((ulong)n * d + c0 + c) * BLK + r) : (vfloat)(0.0f);
        VSTORE(x, t + c * ks + r);
    }
}

/* Columns [c0, c0 + n) of an A operand's tile of rows block nb, laid out as stage_cols lays it:
   k-major (row stride ks) from its block-transposed copy xt when MT_AT, else row-major (t[r * w + c])
   from the tensor x itself (row stride rs, nrows rows). */
__attribute__((always_inline)) inline void stage_cols_a(__local float *t, const int ks, const int w,
                                                        __global const float *xt, __global const float *x,
                                                        ulong rs, int nb, int nrows, int c0, int n, int d)
{
    if (MT_AT)
        stage_tile_t(t, ks, xt, nb, c0, n, d);
    else
        copy_tile(t, w, 1, x, rs, nb * BLK, nrows, c0, n, d);
}

/* Work-group (n + N q, bh) writes block n of the block-transposed copy of input xq (x0 .. x3; a
   launch covers the first get_num_groups(0) / N of them) into slot q0 + q, through local memory:
   staged k-major by copy_tile's transposition, written out a column of the block (BLK contiguous
   floats) at a time. */
#define CASTLE_T_IN(q) __global const float *x##q, const ulong4 s##q
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void castle_transpose_blocks(const int L, const int d, const int H, const int q0, CASTLE_T_IN(0), CASTLE_T_IN(1),
                             CASTLE_T_IN(2), CASTLE_T_IN(3), __global float *ws, const ulong2 ws_t, BH0_PARAM)
{
    __local float lm[KS * DT] LM_ALIGNED;
    const int N = (L + BLK - 1) / BLK, Lpad = N * BLK;
    const int q = get_group_id(0) / N, n = get_group_id(0) % N, bh = BH_INDEX;
    const uint b = bh / H, h = bh % H;
    __global const float *x = q == 0 ? x0 : q == 1 ? x1 : q == 2 ? x2 : x3;
    const ulong4 s = q == 0 ? s0 : q == 1 ? s1 : q == 2 ? s2 : s3;
    __global float *xt = tcopy(ws, ws_t, q0 + q, bh, Lpad, d);
    const int nv = BLK / VW;
    for (int c0 = 0;; c0 += DT) { /* d >= 1; leaves after the last barrier (backward.cl says why) */
        copy_tile(lm, 1, KS, x + tensor_offset(s, b, h, 0), s.z, n * BLK, L, c0, DT, d);
        barrier(CLK_LOCAL_MEM_FENCE);
        FOR_SHARE(e, DT * nv) {
            const int c = e / nv, r = (e - c * nv) * VW;
            if (c0 + c < d)
                GVSTORE(VLOAD(lm + c * KS + r), xt + ((ulong)n * d + c0 + c) * BLK + r);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (c0 + DT >= d)
            break;
    }
}

/* Stable logistic function: no overflow into NaN for any finite x. */
inline float castle_sigmoid(float x)
{
    if (x >= 0.0f)
        return 1.0f / (1.0f + exp(-x));
    const float e = exp(x);
    return e / (1.0f + e);
}

inline float castle_silu(float x) { return fmax(x, -FLT_MAX) * castle_sigmoid(x); } /* as castle_silu_g */

/* Lane-wise pair_add. */
inline void pair_add_v(vfloat *hi, vfloat *lo, vfloat x)
{
    const vfloat s = *hi + x;
    const vfloat bb = s - *hi;
    const vfloat err = (*hi - (s - bb)) + (x - bb);
    const vfloat l = *lo + err;
    *hi = s + l;
    *lo = l - (*hi - s);
}

/* (hi, lo) += x, keeping the bits fl(hi + x) drops (TwoSum, then renormalise).  D_j is kept this
   way so that the backward pass can roll it back by subtraction without the cancellation error of
   plain float sums (docs/algorithm.md section 4). */
inline void pair_add(float *hi, float *lo, float x)
{
    const float s = *hi + x;
    const float bb = s - *hi;
    const float err = (*hi - (s - bb)) + (x - bb);
    const float l = *lo + err;
    *hi = s + l;
    *lo = l - (*hi - s);
}

/* Lane `lane` of `lanes`'s part of a . b over d columns, a a row in global memory (16-byte aligned
   where al: gload4), b a staged vector: quads q = lane + lanes i (float4; adjacent lanes on adjacent
   quads) below d / 4, then the d % 4 tail columns 4 (d / 4) + lane + lanes i.  The decode kernels'
   cross-lane dot products (cache.cl, causal.cl). */
inline float lane_dot(__global const float *a, const bool al, __local const float *b, int lane, int lanes, int d)
{
    const int nq = d >> 2;
    float4 s4 = (float4)(0.0f);
    for (int q = lane; q < nq; q += lanes)
        s4 += gload4(q, a, al) * vload4(q, b);
    float s = (s4.x + s4.y) + (s4.z + s4.w);
    for (int c = 4 * nq + lane; c < d; c += lanes)
        s += a[c] * b[c];
    return s;
}
