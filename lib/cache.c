/* The public API of the UQ-KV cache (docs/algorithm.md section 5): argument checks (lib/validate.c), the
 * cache's state checks (emptiness, capacity), then dispatch to host/cache.c. */
#include "cache.h"
#include "validate.h"
#include "context.h"
#include "error.h"

#include <stdbool.h>
#include <stdlib.h>

castle_status castle_cache_create(castle_context *ctx, const castle_attention_desc *desc, castle_cache **out)
{
    castle__clear_error();
    castle_problem p; /* the layouts are not used (castle.h) */
    castle_status st = castle__check_desc_for(ctx, desc, &p, 0u, CASTLE_CHECK_WINDOW | CASTLE_CHECK_SCALE);
    if (st != CASTLE_SUCCESS)
        return st;
    if (!out)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_cache_create: out is NULL");
    *out = NULL;
    return castle__cache_alloc(ctx, &p, desc->window, out);
}

void castle_cache_destroy(castle_cache *cache) { castle__cache_free(cache); }

castle_status castle_cache_reset(castle_cache *cache)
{
    castle_status st = castle__require("castle_cache_reset", cache, "cache", NULL, NULL);
    if (st == CASTLE_SUCCESS)
        castle__cache_reset(cache);
    return st;
}

CASTLE_DEFINE_GETTER(castle_cache_bytes, castle_cache, cache, size_t, bytes, cache->bytes)

castle_status castle_cache_lengths(const castle_cache *cache, size_t *lengths)
{
    castle_status st = castle__require("castle_cache_lengths", cache, "cache", lengths, "lengths");
    if (st != CASTLE_SUCCESS)
        return st;
    for (size_t b = 0; b < cache->B; ++b)
        lengths[b] = cache->prompt[b] + cache->decoded;
    return CASTLE_SUCCESS;
}

castle_status castle_cache_buffer(const castle_cache *cache, castle_cache_tensor tensor, cl_mem *buffer, size_t *rows)
{
    castle__clear_error();
    if (!cache || !buffer || !rows)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_cache_buffer: %s is NULL",
                            !cache    ? "cache"
                            : !buffer ? "buffer"
                                      : "rows");
    switch (tensor) {
    case CASTLE_CACHE_U:
        *buffer = cache->u;
        break;
    case CASTLE_CACHE_QU:
        *buffer = cache->qu;
        break;
    case CASTLE_CACHE_KC:
        *buffer = cache->kc;
        break;
    case CASTLE_CACHE_VC:
        *buffer = cache->vc;
        break;
    default:
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "castle_cache_buffer: tensor %d is not a cache tensor",
                            (int)tensor);
    }
    *rows = tensor == CASTLE_CACHE_QU ? (size_t)cache->R : cache->cap;
    return CASTLE_SUCCESS;
}

/* Checks shared by prefill and decode: the descriptor against the cache, the buffers, the queue;
   for prefill (a forward pass over the prompt) also the CASTLE calls' limit on seq_len (decode's
   kernels count positions in integers). */
static castle_status check_call(castle_context *ctx, const castle_cache *cache, const castle_attention_desc *desc,
                                castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue,
                                cl_uint nwait, const cl_event *wait, const char *fn, bool prefill)
{
    unsigned used = (1u << (CASTLE_TENSOR_O + 1)) - 1u; /* QU .. VC, O; lse is optional */
    if (bufs[CASTLE_TENSOR_LSE])
        used |= 1u << CASTLE_TENSOR_LSE;
    castle_status st = castle__check_desc_for(ctx, desc, p, used, CASTLE_CHECK_WINDOW | CASTLE_CHECK_SCALE);
    if (st == CASTLE_SUCCESS && prefill)
        st = castle__check_castle_len(p, fn);
    if (st != CASTLE_SUCCESS)
        return st;
    if (!cache)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "%s: cache is NULL", fn);
    if (cache->ctx != ctx)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "%s: the cache belongs to another castle_context", fn);
    if ((st = castle__check_cache_desc(cache, desc, p)))
        return st;
    /* the cache's buffers, which the call writes (U, the ring of qU, kC and vC): no tensor of the call
       may share them (castle_cache_buffer hands them out) */
    const castle_owned owned[] = {{cache->u, "the cache's U", 0, CASTLE_SUCCESS},
                                  {cache->qu, "the cache's qU", 0, CASTLE_SUCCESS},
                                  {cache->kc, "the cache's kC", 0, CASTLE_SUCCESS},
                                  {cache->vc, "the cache's vC", 0, CASTLE_SUCCESS}};
    if ((st = castle__check_call(ctx, p, bufs, used, CASTLE_WRITES_O_LSE, prefill ? 1u << CASTLE_TENSOR_O : 0u, owned, 4)))
        return st;
    return castle__check_queue(ctx, queue, nwait, wait);
}

castle_status castle_prefill(castle_context *ctx, castle_cache *cache, const castle_attention_desc *desc,
                             const size_t *prompt_lengths, cl_mem qu, cl_mem ku, cl_mem vu, cl_mem qc, cl_mem kc,
                             cl_mem vc, cl_mem o, cl_mem lse, cl_command_queue queue, cl_uint num_wait_events,
                             const cl_event *wait_events, cl_event *event)
{
    castle__clear_error();
    castle_problem p;
    const cl_mem bufs[CASTLE_TENSOR_COUNT] = {qu, ku, vu, qc, kc, vc, o, lse};
    castle_status st =
        check_call(ctx, cache, desc, &p, bufs, queue, num_wait_events, wait_events, "castle_prefill", true);
    if (st != CASTLE_SUCCESS)
        return st;
    size_t longest = 0, *lengths = malloc(cache->B * sizeof(size_t));
    if (!lengths)
        return castle__fail(CASTLE_ERR_OUT_OF_HOST_MEMORY, "out of host memory in castle_prefill");
    for (size_t b = 0; b < cache->B; ++b) {
        lengths[b] = prompt_lengths ? prompt_lengths[b] : p.L;
        longest = lengths[b] > longest ? lengths[b] : longest;
        if (lengths[b] > p.L) {
            st = castle__fail(CASTLE_ERR_INVALID_ARGUMENT,
                              "prompt_lengths[%zu] = %zu exceeds the descriptor's seq_len %zu", b, lengths[b], p.L);
            break;
        }
    }
    const size_t cached = castle__cache_longest(cache);
    if (st == CASTLE_SUCCESS && cached > 0)
        st = castle__fail(CASTLE_ERR_CACHE_NOT_EMPTY,
                          "castle_prefill: the cache already holds %zu tokens; castle_cache_reset it first (or append "
                          "with castle_decode)",
                          cached);
    if (st == CASTLE_SUCCESS && longest > cache->cap)
        st = castle__fail(CASTLE_ERR_CACHE_FULL,
                          "castle_prefill: a prompt of %zu tokens exceeds the cache capacity %zu", longest, cache->cap);
    /* The prefill allocates a forward's workspace itself, so its size is checked here, as
       castle_forward_workspace_size checks it for a caller's (ws_floats fits in size_t bytes). */
    if (st == CASTLE_SUCCESS)
        st = castle__check_workspace_fits(ctx, p.ws_forward_floats * sizeof(float));
    if (st == CASTLE_SUCCESS)
        st = castle__schedule_prefill(ctx, cache, &p, lengths, bufs, queue, num_wait_events, wait_events, event);
    free(lengths);
    return st;
}

castle_status castle_decode(castle_context *ctx, castle_cache *cache, const castle_attention_desc *desc, cl_mem qu,
                            cl_mem ku, cl_mem vu, cl_mem qc, cl_mem kc, cl_mem vc, cl_mem o, cl_mem lse,
                            cl_command_queue queue, cl_uint num_wait_events, const cl_event *wait_events,
                            cl_event *event)
{
    castle__clear_error();
    castle_problem p;
    const cl_mem bufs[CASTLE_TENSOR_COUNT] = {qu, ku, vu, qc, kc, vc, o, lse};
    castle_status st =
        check_call(ctx, cache, desc, &p, bufs, queue, num_wait_events, wait_events, "castle_decode", false);
    if (st != CASTLE_SUCCESS)
        return st;
    const size_t longest = castle__cache_longest(cache);
    if (p.L > cache->cap - longest) /* nothing enqueued, the cache stays as it is */
        return castle__fail(CASTLE_ERR_CACHE_FULL,
                            "castle_decode: appending %zu token%s to a sequence of %zu exceeds the cache capacity %zu",
                            p.L, p.L == 1 ? "" : "s", longest, cache->cap);
    return castle__schedule_decode(ctx, cache, &p, longest, bufs, queue, num_wait_events, wait_events, event);
}
