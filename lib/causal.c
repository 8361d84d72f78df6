/* The public API of the standard causal attention baseline: argument checks (lib/validate.c), the
 * KV cache's state checks (emptiness, capacity), then dispatch to host/causal.c. */
#include "causal.h"
#include "validate.h"
#include "context.h"
#include "error.h"

#define BIT(t) (1u << (t))
/* q, k, v, o: every call; lse: required by the forward and backward passes, optional in prefill and
   decode.  A call checks the layouts of the tensors it takes, no others (castle.h). */
#define QKVO (BIT(CASTLE_TENSOR_QC) | BIT(CASTLE_TENSOR_KC) | BIT(CASTLE_TENSOR_VC) | BIT(CASTLE_TENSOR_O))
#define LSE BIT(CASTLE_TENSOR_LSE)
#define GRADIENTS (BIT(CASTLE_TENSOR_DQC) | BIT(CASTLE_TENSOR_DKC) | BIT(CASTLE_TENSOR_DVC)) /* dq, dk, dv */
#define BACKWARD_TENSORS (QKVO | LSE | BIT(CASTLE_TENSOR_DO) | GRADIENTS)

castle_status castle_causal_forward(castle_context *ctx, const castle_attention_desc *desc, cl_mem q, cl_mem k,
                                    cl_mem v, cl_mem o, cl_mem lse, cl_command_queue queue, cl_uint num_wait_events,
                                    const cl_event *wait_events, cl_event *event)
{
    castle__clear_error();
    castle_problem p;
    castle_status st = castle__check_desc_for(ctx, desc, &p, QKVO | LSE, CASTLE_CHECK_SCALE);
    if (st != CASTLE_SUCCESS)
        return st;
    const cl_mem bufs[CASTLE_TENSOR_COUNT] = {[CASTLE_TENSOR_QC] = q,
                                              [CASTLE_TENSOR_KC] = k,
                                              [CASTLE_TENSOR_VC] = v,
                                              [CASTLE_TENSOR_O] = o,
                                              [CASTLE_TENSOR_LSE] = lse};
    if ((st = castle__check_call(ctx, &p, bufs, QKVO | LSE, CASTLE_WRITES_O_LSE, 0, NULL, 0)) ||
        (st = castle__check_queue(ctx, queue, num_wait_events, wait_events)))
        return st;
    return castle__causal_forward(ctx, &p, bufs, queue, num_wait_events, wait_events, event);
}

castle_status castle_causal_backward(castle_context *ctx, const castle_attention_desc *desc, cl_mem q, cl_mem k,
                                     cl_mem v, cl_mem o, cl_mem lse, cl_mem d_o, cl_mem dq, cl_mem dk, cl_mem dv,
                                     cl_command_queue queue, cl_uint num_wait_events, const cl_event *wait_events,
                                     cl_event *event)
{
    castle__clear_error();
    castle_problem p;
    castle_status st = castle__check_desc_for(ctx, desc, &p, BACKWARD_TENSORS, CASTLE_CHECK_SCALE);
    if (st != CASTLE_SUCCESS)
        return st;
    const cl_mem bufs[CASTLE_TENSOR_COUNT] = {
        [CASTLE_TENSOR_QC] = q,   [CASTLE_TENSOR_KC] = k,    [CASTLE_TENSOR_VC] = v,
        [CASTLE_TENSOR_O] = o,    [CASTLE_TENSOR_LSE] = lse, [CASTLE_TENSOR_DO] = d_o,
        [CASTLE_TENSOR_DQC] = dq, [CASTLE_TENSOR_DKC] = dk,  [CASTLE_TENSOR_DVC] = dv};
    if ((st = castle__check_call(ctx, &p, bufs, BACKWARD_TENSORS, GRADIENTS, 0, NULL, 0)) ||
        (st = castle__check_queue(ctx, queue, num_wait_events, wait_events)))
        return st;
    return castle__causal_backward(ctx, &p, bufs, queue, num_wait_events, wait_events, event);
}

/* ---- KV cache ---- */

castle_status castle_kv_cache_create(castle_context *ctx, const castle_attention_desc *desc, castle_kv_cache **out)
{
    castle__clear_error();
    castle_problem p; /* window, scale and the layouts are not used (castle.h) */
    castle_status st = castle__check_desc_for(ctx, desc, &p, 0u, 0u);
    if (st != CASTLE_SUCCESS)
        return st;
    if (!out)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_kv_cache_create: out is NULL");
    *out = NULL;
    return castle__kv_cache_alloc(ctx, &p, out);
}

void castle_kv_cache_destroy(castle_kv_cache *cache) { castle__kv_cache_free(cache); }

castle_status castle_kv_cache_reset(castle_kv_cache *cache)
{
    castle_status st = castle__require("castle_kv_cache_reset", cache, "cache", NULL, NULL);
    if (st == CASTLE_SUCCESS)
        castle__kv_cache_reset(cache);
    return st;
}

CASTLE_DEFINE_GETTER(castle_kv_cache_bytes, castle_kv_cache, cache, size_t, bytes, cache->bytes)
CASTLE_DEFINE_GETTER(castle_kv_cache_length, castle_kv_cache, cache, size_t, length, cache->len)

/* castle_causal_prefill (prefill: the cache must be empty) and castle_causal_decode: the checks, then
   the capacity (nothing is enqueued past it), then host/causal.c.  lse is optional. */
static castle_status append(castle_context *ctx, castle_kv_cache *cache, const castle_attention_desc *desc, cl_mem q,
                            cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_command_queue queue, cl_uint nwait,
                            const cl_event *wait, cl_event *event, bool prefill, const char *fn)
{
    castle__clear_error();
    castle_problem p;
    const unsigned used = QKVO | (lse ? LSE : 0u);
    castle_status st = castle__check_desc_for(ctx, desc, &p, used, CASTLE_CHECK_SCALE);
    if (st != CASTLE_SUCCESS)
        return st;
    if (!cache)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "%s: cache is NULL", fn);
    if (cache->ctx != ctx)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "%s: the cache belongs to another castle_context", fn);
    const cl_mem bufs[CASTLE_TENSOR_COUNT] = {[CASTLE_TENSOR_QC] = q,
                                              [CASTLE_TENSOR_KC] = k,
                                              [CASTLE_TENSOR_VC] = v,
                                              [CASTLE_TENSOR_O] = o,
                                              [CASTLE_TENSOR_LSE] = lse};
    /* the cache's buffers, which the call appends to: a tensor of the call must not share them */
    const castle_owned owned[] = {{cache->k, "the KV cache's keys", 0, CASTLE_SUCCESS},
                                  {cache->v, "the KV cache's values", 0, CASTLE_SUCCESS}};
    if ((st = castle__check_kv_cache_desc(cache, &p)) ||
        (st = castle__check_call(ctx, &p, bufs, used, CASTLE_WRITES_O_LSE, 0, owned, 2)) ||
        (st = castle__check_queue(ctx, queue, nwait, wait)))
        return st;
    if (prefill && cache->len > 0)
        return castle__fail(CASTLE_ERR_CACHE_NOT_EMPTY,
                            "%s: the KV cache already holds %zu tokens; castle_kv_cache_reset it first (or append "
                            "with castle_causal_decode)",
                            fn, cache->len);
    if (p.L > cache->cap - cache->len)
        return castle__fail(CASTLE_ERR_CACHE_FULL,
                            "%s: appending %zu token%s to %zu exceeds the KV cache capacity %zu", fn, p.L,
                            p.L == 1 ? "" : "s", cache->len, cache->cap);
    return castle__causal_decode(ctx, fn, cache, &p, bufs, queue, nwait, wait, event);
}

castle_status castle_causal_prefill(castle_context *ctx, castle_kv_cache *cache, const castle_attention_desc *desc,
                                    cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_command_queue queue,
                                    cl_uint num_wait_events, const cl_event *wait_events, cl_event *event)
{
    return append(ctx, cache, desc, q, k, v, o, lse, queue, num_wait_events, wait_events, event, true,
                  "castle_causal_prefill");
}

castle_status castle_causal_decode(castle_context *ctx, castle_kv_cache *cache, const castle_attention_desc *desc,
                                   cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_command_queue queue,
                                   cl_uint num_wait_events, const cl_event *wait_events, cl_event *event)
{
    return append(ctx, cache, desc, q, k, v, o, lse, queue, num_wait_events, wait_events, event, false,
                  "castle_causal_decode");
}
