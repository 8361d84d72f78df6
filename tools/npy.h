/*
 * npy.h - strict reader/writer for NumPy .npy files holding float32 arrays.
 *
 * Supported on read: format versions 1.0, 2.0 and 3.0; dtype '<f4' (and '=f4'
 * on little-endian hosts); C order only; up to NPY_MAX_DIMS dimensions.
 * Written files use format 1.0, dtype '<f4', C order, with the header laid out
 * exactly as numpy's np.save does (64-byte aligned data, spare growth space).
 *
 * Neither function prints anything: problems are reported through the return
 * value and a one-line message of the form "<path>: <problem>" in err.
 */
#ifndef CASTLE_TOOLS_NPY_H
#define CASTLE_TOOLS_NPY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define NPY_MAX_DIMS 8

typedef struct npy_array {
    int ndim;
    size_t shape[NPY_MAX_DIMS]; /* entries at index >= ndim are 0 */
    size_t count;               /* product of shape (1 for ndim 0) */
    float *data;                /* count floats, malloc'd, C order; on success
                                   never NULL (even when count is 0) */
} npy_array;

/* Reads a float32 .npy file.  Returns 0 on success.  On failure returns
 * nonzero, leaves *out zeroed (data NULL) and writes a one-line message naming
 * the file and the problem into err (errlen bytes, always NUL-terminated when
 * errlen > 0; err may be NULL when errlen is 0).  On success err holds "". */
int npy_read_f32(const char *path, npy_array *out, char *err, size_t errlen);

/* Writes count = prod(shape[0..ndim)) floats from data as a version 1.0 .npy
 * file with dtype '<f4'.  ndim must be in [0, NPY_MAX_DIMS]; shape may be NULL
 * only when ndim is 0; data may be NULL only when count is 0.  Returns 0 on
 * success, nonzero with a message in err on failure (a partially written file
 * is removed). */
int npy_write_f32(const char *path, const float *data, int ndim,
                  const size_t *shape, char *err, size_t errlen);

/* Frees a->data and zeroes *a.  Accepts NULL and zeroed arrays; calling it
 * twice on the same array is harmless. */
void npy_free(npy_array *a);

#ifdef __cplusplus
}
#endif

#endif /* CASTLE_TOOLS_NPY_H */
