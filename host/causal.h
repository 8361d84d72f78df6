/* Standard causal attention, the baseline: KV cache and schedules (host/causal.c, cl/causal.cl). */
#ifndef CASTLE_HOST_CAUSAL_H
#define CASTLE_HOST_CAUSAL_H

#include "validate.h"

/* Decode calls of at most CASTLE_DECODE_ROWS new tokens use castle_causal_decode, whose
   work-groups have at most CASTLE_DECODE_GROUP work-items; cl/causal.cl receives both as -D options
   (host/program.c), so they are defined here only. */
#define CASTLE_DECODE_ROWS 4
#define CASTLE_DECODE_GROUP 64

struct castle_kv_cache {
    castle_context *ctx;
    size_t B, H, d, cap; /* cap: tokens per sequence */
    size_t len;          /* tokens every sequence holds */
    cl_mem k, v;         /* packed (B, H, cap, d) */
    cl_mem part;         /* decode scratch: split partials, part_floats floats */
    size_t part_floats;
    size_t bytes; /* device bytes of k, v, part */
};

castle_status castle__kv_cache_alloc(castle_context *ctx, const castle_problem *p, castle_kv_cache **out);
void castle__kv_cache_free(castle_kv_cache *c);
/* Empties the cache (host side only: the next call writes from row 0). */
void castle__kv_cache_reset(castle_kv_cache *c);
/* bufs is indexed by castle_tensor: QC, KC, VC, O, LSE (forward; lse may be NULL in decode), DO,
   DQC, DKC, DVC (backward). */
castle_status castle__causal_forward(castle_context *ctx, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                     cl_command_queue queue, cl_uint nwait, const cl_event *wait, cl_event *event);
castle_status castle__causal_backward(castle_context *ctx, const castle_problem *p,
                                      const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                      const cl_event *wait, cl_event *event);
/* Appends p->L tokens to c and writes their outputs (prefill: c empty); fn names the call in errors. */
castle_status castle__causal_decode(castle_context *ctx, const char *fn, castle_kv_cache *c, const castle_problem *p,
                                    const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                    const cl_event *wait, cl_event *event);

#endif
