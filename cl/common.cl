/* common.cl: definitions shared by every libcastle kernel family.
 *
 * Tunables arrive as -D options from the host (host/tuning.c); each has a default here so that
 * every .cl file compiles on its own with any OpenCL C 1.2 compiler.
 * Never build with -cl-fast-relaxed-math or -cl-finite-math-only: -INFINITY is the score mask. */

#ifndef BLK
#define BLK 32          /* rows per block (SPEC section 3) */
#endif
#ifndef NT
#define NT 256          /* work-items per work-group; multiple of BLK, divides BLK*BLK and BLK*DT */
#endif
#ifndef DT
#define DT 32           /* columns of d staged through local memory per step */
#endif

#define TS (DT + 1)     /* padded row stride of a BLK x DT tile in local memory */
#define BP (BLK + 1)    /* padded row stride of a BLK x BLK matrix in local memory */
#define RSTEP (NT / BLK)          /* rows between the entries one work-item owns */
#define EPT (BLK * BLK / NT)      /* entries of a BLK x BLK matrix per work-item */
#define EPC (BLK * DT / NT)       /* entries of a BLK x DT tile per work-item */

/* Element offset of (batch b, head h, row r) for strides s = (batch, head, row, unused). */
inline ulong tensor_offset(ulong4 s, uint b, uint h, uint r)
{
    return (ulong)b * s.x + (ulong)h * s.y + (ulong)r * s.z;
}

/* Stable logistic function: no overflow into NaN for any finite x. */
inline float castle_sigmoid(float x)
{
    if (x >= 0.0f)
        return 1.0f / (1.0f + exp(-x));
    const float e = exp(x);
    return e / (1.0f + e);
}

inline float castle_silu(float x) { return x * castle_sigmoid(x); }

/* d SiLU / dx = sigmoid(x) (1 + x (1 - sigmoid(x))). */
inline float castle_silu_grad(float x)
{
    const float g = castle_sigmoid(x);
    return g * (1.0f + x * (1.0f - g));
}

/* (hi, lo) += x, keeping the bits fl(hi + x) drops (TwoSum, then renormalise).  D_j is kept this
   way so that the backward pass can roll it back by subtraction without the cancellation error of
   plain float sums (SPEC section 4). */
inline void pair_add(float *hi, float *lo, float x)
{
    const float s = *hi + x;
    const float bb = s - *hi;
    const float err = (*hi - (s - bb)) + (x - bb);
    const float l = *lo + err;
    *hi = s + l;
    *lo = l - (*hi - s);
}

/* Stages rows [row0, row0+BLK) x columns [c0, c0+DT) of a row-major matrix (row stride rs,
   base at p) into the local tile t (BLK x TS).  Rows >= nrows and columns >= d read as 0, so a
   ragged block never reads past its tensor. */
inline void load_tile(__local float *t, __global const float *p, ulong rs, int row0, int nrows,
                      int c0, int d)
{
    for (int e = get_local_id(0); e < BLK * DT; e += NT) {
        const int r = e / DT, c = e % DT;
        const int gr = row0 + r, gc = c0 + c;
        t[r * TS + c] = (gr < nrows && gc < d) ? p[(ulong)gr * rs + gc] : 0.0f;
    }
}
