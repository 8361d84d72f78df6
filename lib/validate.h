/* The validated problem: one descriptor check for every call (lib/validate.c). */
#ifndef CASTLE_LIB_VALIDATE_H
#define CASTLE_LIB_VALIDATE_H

#include "castle/castle.h"

#include <stddef.h>

/* Workspace regions, each for all batch entries x heads, in this order: the forward's first (D_j hi
   and lo parts as the forward leaves them, Lpad x d each; the scaled masked X[T_i, T_i] blocks
   and their transposes, N x 2 BLK x BLK; the softmax state m, l, Lpad x 2; the block-transposed copies of seven inputs
   that a pass stages its k-major tiles from, cl/common.cl castle_transpose_blocks, 7 x Lpad x d
   slot-major, the forward's CASTLE_WS_T_FORWARD slots first), then the backward's own (its working
   copy of D, hi and lo, and dD, Lpad x d each; Delta = rowsum(dO * O), Lpad; the gradient of each
   X block summed over its row block's block pairs, N x BLK x BLK).  A forward alone
   needs ws_forward_floats. */
#define CASTLE_WS_T_SLOTS 7   /* slots of CASTLE_WS_T (cl/common.cl CASTLE_T_*) */
#define CASTLE_WS_T_FORWARD 4 /* the first slots, the forward's; the backward fills the others */
#define CASTLE_WS_T_INPUTS 4  /* inputs of one launch of castle_transpose_blocks, at most */
typedef enum castle_ws_region {
    CASTLE_WS_D_HI = 0,
    CASTLE_WS_D_LO,
    CASTLE_WS_X,
    CASTLE_WS_ML,
    CASTLE_WS_T,
    CASTLE_WS_W_HI,
    CASTLE_WS_W_LO,
    CASTLE_WS_DD,
    CASTLE_WS_DELTA,
    CASTLE_WS_DY,
    CASTLE_WS_COUNT
} castle_ws_region;

typedef struct castle_problem {
    size_t B, H, L, d;
    long W;
    float scale;
    size_t N, Lpad;                        /* blocks, padded length */
    cl_ulong4 strides[CASTLE_TENSOR_COUNT]; /* batch, head, row, 0 */
    size_t ws_floats;                       /* workspace size, floats */
    size_t ws_forward_floats;               /* the part a forward alone uses (a prefix), floats */
    size_t ws_off[CASTLE_WS_COUNT];         /* region offsets, floats, indexed by castle_ws_region */
} castle_problem;

extern const char *const castle__tensor_names[CASTLE_TENSOR_COUNT];
/* desc non-NULL and struct_size (the caller's sizeof) a descriptor version this library knows;
   `who` names the caller in the message. */
castle_status castle__check_desc_size(const castle_attention_desc *desc, size_t struct_size, const char *who);
/* Checks the descriptor (shape, window, scale, strides, sizes) under the context's tuning and
   fills p.  The one place a descriptor is validated; the calls whose kernels bound the length
   further (castle_forward, castle_backward, castle_prefill) add castle__check_castle_len. */
castle_status castle__check_desc(const castle_context *ctx, const castle_attention_desc *desc, castle_problem *p);
/* The same, for a call that uses only some of the descriptor (castle.h says which fields each call
   ignores): the layouts of the tensors in `layouts` (a bit per castle_tensor; the others' strides
   in p are 0), the window where checks has CASTLE_CHECK_WINDOW (else p->W is 0), the scale where
   it has CASTLE_CHECK_SCALE (else p->scale is 1/sqrt(d)).  Shape and sizes always. */
enum { CASTLE_CHECK_WINDOW = 1, CASTLE_CHECK_SCALE = 2 };
#define CASTLE_ALL_LAYOUTS ((1u << CASTLE_TENSOR_COUNT) - 1u)
castle_status castle__check_desc_for(const castle_context *ctx, const castle_attention_desc *desc, castle_problem *p,
                                     unsigned layouts, unsigned checks);
/* CASTLE_ERR_SIZE_OVERFLOW when a checked problem has more than CASTLE_MAX_SEQ_LEN tokens: the CASTLE
   calls' limit (fn names the call in the message). */
castle_status castle__check_castle_len(const castle_problem *p, const char *fn);
/* CASTLE_ERR_WORKSPACE_TOO_LARGE when a workspace of `bytes` passes the device's largest allocation. */
castle_status castle__check_workspace_fits(const castle_context *ctx, size_t bytes);
/* The access a call needs to a buffer (castle__check_buffer's `access`). */
enum { CASTLE_ACCESS_READ = 1, CASTLE_ACCESS_WRITE = 2 };
/* Checks that buf is a buffer object (not an image) of ctx holding `floats` floats (else too_small),
   whose CL_MEM_READ_ONLY / CL_MEM_WRITE_ONLY flags allow the access the call needs. */
castle_status castle__check_buffer(const castle_context *ctx, cl_mem buf, size_t floats, const char *name,
                                   castle_status too_small, unsigned access);
/* A buffer a call owns besides its tensors (the workspace, a cache's buffers): the call may write it,
   so it may share memory with nothing else the call is given.  floats > 0: it must be a buffer of this
   context holding that many floats (else too_small) that the call may read and write; 0: the owner
   made it (a cache's). */
typedef struct castle_owned {
    cl_mem mem;
    const char *name;
    size_t floats;
    castle_status too_small;
} castle_owned;
#define CASTLE_MAX_OWNED 4
/* The tensors a forward, prefill or decode writes (castle__check_call's `writes`): o and lse. */
#define CASTLE_WRITES_O_LSE ((1u << CASTLE_TENSOR_O) | (1u << CASTLE_TENSOR_LSE))
/* Checks every tensor t with bit t of `used` set (non-NULL, a buffer of this context, large enough
   for its layout, readable unless the call only writes it: bit t of `writes` and not of `rmw`, the
   outputs the call also reads; writable where it writes it) and the nowned (at most CASTLE_MAX_OWNED)
   owned buffers, and that no tensor the call writes and no owned buffer shares memory with another
   tensor or owned buffer: the one place a call's buffers are checked against each other. */
castle_status castle__check_call(const castle_context *ctx, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                 unsigned used, unsigned writes, unsigned rmw, const castle_owned *owned, int nowned);
/* castle__check_call with the workspace as the one owned buffer (at least p->ws_floats floats, else
   CASTLE_ERR_WORKSPACE_TOO_SMALL). */
castle_status castle__check_buffers(const castle_context *ctx, const castle_problem *p,
                                    const cl_mem bufs[CASTLE_TENSOR_COUNT], unsigned used, unsigned writes,
                                    unsigned rmw, cl_mem workspace);
/* Clears the thread's last error, then checks the caller's pointers: CASTLE_ERR_NULL_POINTER naming
   the first of a (named an) and b (named bn; bn = NULL: no second pointer) that is NULL, in function fn.
   The entry check of the small API functions (getters, resets). */
castle_status castle__require(const char *fn, const void *a, const char *an, const void *b, const char *bn);
/* Defines the API getter `castle_status fn(const type *obj, out_type *out)` that writes `value` (an
   expression in obj) to *out after castle__require: one definition for every handle's getters. */
#define CASTLE_DEFINE_GETTER(fn, type, obj, out_type, out, value)                                          \
    castle_status fn(const type *obj, out_type *out)                                                         \
    {                                                                                                        \
        castle_status st_ = castle__require(#fn, obj, #obj, out, #out);                                      \
        if (st_ == CASTLE_SUCCESS)                                                                           \
            *out = (value);                                                                                  \
        return st_;                                                                                          \
    }
/* Checks queue (non-NULL, same context and device) and the wait list. */
castle_status castle__check_queue(const castle_context *ctx, cl_command_queue queue, cl_uint n, const cl_event *list);


/* Checks that a prefill or decode descriptor (validated into p) matches the cache's batch, heads,
   head_dim, window and scale (else CASTLE_ERR_SHAPE_MISMATCH). */
castle_status castle__check_cache_desc(const castle_cache *c, const castle_attention_desc *desc,
                                       const castle_problem *p);
/* Checks a prefill or decode descriptor (validated into p) against the cache's batch, heads and
   head_dim (else CASTLE_ERR_SHAPE_MISMATCH). */
castle_status castle__check_kv_cache_desc(const castle_kv_cache *c, const castle_problem *p);

#endif
