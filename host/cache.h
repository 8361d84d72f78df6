/* The UQ-KV cache: state, allocation, prefill and decode schedules (host/cache.c, cl/cache.cl). */
#ifndef CASTLE_HOST_CACHE_H
#define CASTLE_HOST_CACHE_H

#include "validate.h"

#include <stdbool.h>

struct castle_cache {
    castle_context *ctx;
    size_t B, H, d, cap;  /* cap: tokens per sequence */
    long window;          /* as created: descriptors must repeat it */
    int W, R;             /* window in force (0 when none reaches past the capacity); QU ring rows */
    float scale;          /* resolved (never 0) */
    cl_mem u, qu, kc, vc; /* packed (B, H, rows, d): rows = cap, for qu R */
    cl_mem lens;          /* B ints on the device: each sequence's length after its prefill */
    cl_mem part;          /* decode scratch: B*H x nchunks x (d + 2) floats */
    size_t nchunks;       /* most work-groups a decode splits one sequence into */
    size_t *prompt;       /* B: host copy of lens */
    size_t decoded;       /* tokens castle_decode appended since the prefill (every sequence alike) */
    bool lens_valid;      /* false after a reset: the next decode zeroes lens first */
    size_t bytes;         /* device bytes of all the buffers above */
};
castle_status castle__cache_alloc(castle_context *ctx, const castle_problem *p, long window, castle_cache **out);
void castle__cache_free(castle_cache *c);
void castle__cache_reset(castle_cache *c);
/* Tokens the longest sequence holds (its prompt plus the tokens decoded since). */
size_t castle__cache_longest(const castle_cache *c);

/* bufs is indexed by castle_tensor (QU .. VC, O, LSE; lse may be NULL).  lengths: B prompt lengths. */
castle_status castle__schedule_prefill(castle_context *ctx, castle_cache *c, const castle_problem *p,
                                       const size_t *lengths, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                       cl_command_queue queue, cl_uint nwait, const cl_event *wait, cl_event *event);
/* longest: the longest sequence in the cache before the call (castle__cache_longest). */
castle_status castle__schedule_decode(castle_context *ctx, castle_cache *c, const castle_problem *p, size_t longest,
                                      const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                      const cl_event *wait, cl_event *event);

#endif
