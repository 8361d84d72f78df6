/* The one place where descriptors, buffers, queues and wait lists are validated. */
#include "validate.h"
#include "cache.h"
#include "causal.h"
#include "context.h"
#include "error.h"
#include "tuning.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

const char *const castle__tensor_names[CASTLE_TENSOR_COUNT] = {
    "qu", "ku", "vu", "qc", "kc", "vc", "o", "lse", "d_o", "d_qu", "d_ku", "d_vu", "d_qc", "d_kc", "d_vc"};
#define tensor_names castle__tensor_names

static bool is_output(int t) { return t == CASTLE_TENSOR_O || t == CASTLE_TENSOR_LSE || t >= CASTLE_TENSOR_DQU; }

static bool mul_ok(size_t a, size_t b, size_t *r)
{
    if (a && b > SIZE_MAX / a)
        return false;
    *r = a * b;
    return true;
}

static bool add_ok(size_t a, size_t b, size_t *r)
{
    if (b > SIZE_MAX - a)
        return false;
    *r = a + b;
    return true;
}

/* Elements spanned by a layout: (B-1) bs + (H-1) hs + (L-1) rs + width. */
static bool layout_span(const castle_layout *l, size_t B, size_t H, size_t L, size_t width, size_t *span)
{
    size_t a, b, c, s;
    return mul_ok(B - 1, l->batch_stride, &a) && mul_ok(H - 1, l->head_stride, &b) &&
           mul_ok(L - 1, l->row_stride, &c) && add_ok(a, b, &s) && add_ok(s, c, &s) && add_ok(s, width, span);
}

/* True when distinct (b, h, row) index triples never share an element. */
static bool layout_disjoint(const castle_layout *l, size_t B, size_t H, size_t L, size_t width)
{
    size_t st[3] = {l->batch_stride, l->head_stride, l->row_stride}, n[3] = {B, H, L};
    for (int a = 0; a < 3; ++a) /* sort by stride, ascending */
        for (int b = a + 1; b < 3; ++b)
            if (st[b] < st[a]) {
                size_t t = st[a];
                st[a] = st[b];
                st[b] = t;
                t = n[a];
                n[a] = n[b];
                n[b] = t;
            }
    size_t span = width;
    for (int a = 0; a < 3; ++a) {
        if (n[a] == 1)
            continue;
        if (st[a] < span)
            return false;
        span = st[a] * (n[a] - 1) + span; /* no overflow: layout_span succeeded */
    }
    return true;
}

castle_status castle__check_desc_size(const castle_attention_desc *desc, size_t struct_size, const char *who)
{
    if (!desc)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "%s: the attention descriptor is NULL", who);
    /* One version of the struct so far: every other size is a caller built against another header. */
    if (struct_size != sizeof(castle_attention_desc))
        return castle__fail(CASTLE_ERR_DESC_VERSION,
                            "%s: descriptor struct_size is %zu, this library knows %zu; fill it with "
                            "castle_attention_desc_init",
                            who, struct_size, sizeof(castle_attention_desc));
    return CASTLE_SUCCESS;
}

castle_status castle__check_castle_len(const castle_problem *p, const char *fn)
{
    if (p->L > CASTLE_MAX_SEQ_LEN)
        return castle__fail(CASTLE_ERR_SIZE_OVERFLOW,
                            "%s: seq_len=%zu: at most %d tokens per CASTLE call (the kernels compare positions as "
                            "float32, exact up to 2^24)",
                            fn, p->L, CASTLE_MAX_SEQ_LEN);
    return CASTLE_SUCCESS;
}

castle_status castle__check_desc(const castle_context *ctx, const castle_attention_desc *desc, castle_problem *p)
{
    return castle__check_desc_for(ctx, desc, p, CASTLE_ALL_LAYOUTS, CASTLE_CHECK_WINDOW | CASTLE_CHECK_SCALE);
}

castle_status castle__check_desc_for(const castle_context *ctx, const castle_attention_desc *desc, castle_problem *p,
                                     unsigned layouts, unsigned checks)
{
    if (!ctx)
        return castle__fail(CASTLE_ERR_NULL_CONTEXT, "the castle_context is NULL");
    if (!desc)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "the attention descriptor is NULL");
    castle_status st = castle__check_desc_size(desc, desc->struct_size, "the attention descriptor");
    if (st != CASTLE_SUCCESS)
        return st;
    memset(p, 0, sizeof *p);
    p->B = desc->batch;
    p->H = desc->heads;
    p->L = desc->seq_len;
    p->d = desc->head_dim;
    if (!p->B || !p->H || !p->L || !p->d)
        return castle__fail(CASTLE_ERR_ZERO_SIZE, "batch=%zu heads=%zu seq_len=%zu head_dim=%zu: all must be >= 1",
                            p->B, p->H, p->L, p->d);
    if (p->d > CASTLE_MAX_HEAD_DIM)
        return castle__fail(CASTLE_ERR_HEAD_DIM, "head_dim=%zu: supported head dims are 1..%d", p->d,
                            CASTLE_MAX_HEAD_DIM);
    if ((checks & CASTLE_CHECK_WINDOW) && desc->window < 0)
        return castle__fail(CASTLE_ERR_NEGATIVE_WINDOW, "window=%ld: must be 0 (CASTLE) or >= 1 (CASTLE-SWL)",
                            desc->window);
    if ((checks & CASTLE_CHECK_SCALE) && !(desc->scale >= 0.0f && desc->scale <= CASTLE_MAX_SCALE))
        return castle__fail(CASTLE_ERR_BAD_SCALE,
                            "scale=%.9g: must be in [0, %g] (0 means 1/sqrt(d); larger scales overflow the float32 scores)",
                            (double)desc->scale, (double)CASTLE_MAX_SCALE);
    const size_t blk = ctx->tuning.block;
    size_t bh;
    if (p->L > (size_t)INT_MAX - blk) /* the kernels count positions, rounded up to whole blocks, in int */
        return castle__fail(CASTLE_ERR_SIZE_OVERFLOW,
                            "seq_len=%zu: at most %zu (INT_MAX less the tuning's block of %zu: the kernels count "
                            "positions in int)",
                            p->L, (size_t)INT_MAX - blk, blk);
    if (!mul_ok(p->B, p->H, &bh) || bh > (size_t)INT_MAX)
        return castle__fail(CASTLE_ERR_SIZE_OVERFLOW, "batch*heads=%zu*%zu: must fit in an int", p->B, p->H);
    /* A window reaching past the sequence is no window at all. */
    p->W = !(checks & CASTLE_CHECK_WINDOW) || (size_t)desc->window >= p->L ? 0 : desc->window;
    p->scale = (checks & CASTLE_CHECK_SCALE) && desc->scale > 0.0f ? desc->scale : (float)(1.0 / sqrt((double)p->d));
    p->N = (p->L + blk - 1) / blk;
    p->Lpad = p->N * blk;

    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
        if (!(layouts >> t & 1u))
            continue; /* not used by the call: its strides stay 0 */
        castle_layout l = desc->layout[t];
        const bool is_lse = t == CASTLE_TENSOR_LSE;
        const size_t width = is_lse ? 1 : p->d;
        if (!l.batch_stride && !l.head_stride && !l.row_stride) {
            l.row_stride = width;
            if (!mul_ok(p->L, width, &l.head_stride) || !mul_ok(p->H, l.head_stride, &l.batch_stride))
                return castle__fail(CASTLE_ERR_SIZE_OVERFLOW, "packed size of %s overflows", tensor_names[t]);
        }
        if (l.row_stride < width)
            return castle__fail(CASTLE_ERR_BAD_STRIDE, "%s row_stride=%zu is smaller than its row width %zu",
                                tensor_names[t], l.row_stride, width);
        size_t span;
        if (!layout_span(&l, p->B, p->H, p->L, width, &span) || span > SIZE_MAX / sizeof(float))
            return castle__fail(CASTLE_ERR_SIZE_OVERFLOW, "the extent of %s overflows", tensor_names[t]);
        if (is_output(t) && !layout_disjoint(&l, p->B, p->H, p->L, width))
            return castle__fail(CASTLE_ERR_BAD_STRIDE,
                                "output %s strides (batch %zu, head %zu, row %zu) do not nest: taken in ascending "
                                "order, each must be at least the extent of the smaller ones (rows could overlap)",
                                tensor_names[t], l.batch_stride, l.head_stride, l.row_stride);
        p->strides[t].s[0] = l.batch_stride;
        p->strides[t].s[1] = l.head_stride;
        p->strides[t].s[2] = l.row_stride;
        p->strides[t].s[3] = span; /* elements the buffer must hold */
    }

    /* Workspace regions (castle_ws_region), each for all batch entries x heads. */
    size_t dsz, xsz, mlsz, tsz, rsz, ysz;
    if (!mul_ok(p->Lpad, p->d, &dsz) || !mul_ok(dsz, bh, &dsz) || !mul_ok(p->N, 2 * blk * blk, &xsz) ||
        !mul_ok(xsz, bh, &xsz) || !mul_ok(p->Lpad, 2, &mlsz) || !mul_ok(mlsz, bh, &mlsz) ||
        !mul_ok(dsz, CASTLE_WS_T_SLOTS, &tsz) || !mul_ok(p->Lpad, bh, &rsz) || !mul_ok(p->N, blk * blk, &ysz) ||
        !mul_ok(ysz, bh, &ysz))
        return castle__fail(CASTLE_ERR_SIZE_OVERFLOW, "the workspace size overflows");
    const size_t region[CASTLE_WS_COUNT] = {dsz, dsz, xsz, mlsz, tsz, dsz, dsz, dsz, rsz, ysz};
    size_t total = 0;
    for (int r = 0; r < CASTLE_WS_COUNT; ++r) {
        p->ws_off[r] = total;
        if (!add_ok(total, region[r], &total))
            return castle__fail(CASTLE_ERR_SIZE_OVERFLOW, "the workspace size overflows");
    }
    if (total > SIZE_MAX / sizeof(float))
        return castle__fail(CASTLE_ERR_SIZE_OVERFLOW, "the workspace size overflows");
    p->ws_floats = total;
    p->ws_forward_floats = p->ws_off[CASTLE_WS_T] + CASTLE_WS_T_FORWARD * dsz; /* below total: no overflow */
    return CASTLE_SUCCESS;
}

castle_status castle__check_workspace_fits(const castle_context *ctx, size_t bytes)
{
    const unsigned long long max = ctx->info.max_alloc_size;
    if (max && bytes > max)
        return castle__fail(CASTLE_ERR_WORKSPACE_TOO_LARGE,
                            "the workspace needs %zu bytes; the device's largest allocation "
                            "(CL_DEVICE_MAX_MEM_ALLOC_SIZE) is %llu bytes: use fewer batch entries x heads or a "
                            "shorter sequence per call",
                            bytes, max);
    return CASTLE_SUCCESS;
}

castle_status castle__check_buffer(const castle_context *ctx, cl_mem buf, size_t floats, const char *name,
                                   castle_status too_small, unsigned access)
{
    if (!buf)
        return castle__fail(CASTLE_ERR_NULL_BUFFER, "buffer %s is NULL", name);
    size_t size = 0;
    cl_context owner = NULL;
    cl_mem_object_type type = 0;
    cl_mem_flags flags = 0; /* a sub-buffer reports the access it inherited too */
    cl_int err = clGetMemObjectInfo(buf, CL_MEM_SIZE, sizeof size, &size, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(buf, CL_MEM_CONTEXT, sizeof owner, &owner, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(buf, CL_MEM_TYPE, sizeof type, &type, NULL);
    if (err == CL_SUCCESS)
        err = clGetMemObjectInfo(buf, CL_MEM_FLAGS, sizeof flags, &flags, NULL);
    if (err != CL_SUCCESS)
        return castle__fail((castle_status)err, "buffer %s is not a valid cl_mem (clGetMemObjectInfo: %d)", name,
                            (int)err);
    if (owner != ctx->cl_ctx)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "buffer %s belongs to another OpenCL context", name);
    if (type != CL_MEM_OBJECT_BUFFER)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT,
                            "%s is a memory object of type 0x%x, not a buffer (an image?): the kernels take buffers",
                            name, (unsigned)type);
    if ((access & CASTLE_ACCESS_READ) && (flags & CL_MEM_WRITE_ONLY))
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "buffer %s is CL_MEM_WRITE_ONLY; the call reads it%s", name,
                            (access & CASTLE_ACCESS_WRITE) ? " as well as writing it: create it CL_MEM_READ_WRITE" : "");
    if ((access & CASTLE_ACCESS_WRITE) && (flags & CL_MEM_READ_ONLY))
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "buffer %s is CL_MEM_READ_ONLY; the call writes it", name);
    if (size / sizeof(float) < floats)
        return castle__fail(too_small, "buffer %s holds %zu bytes; the descriptor needs %zu", name, size, floats * sizeof(float));
    return CASTLE_SUCCESS;
}

castle_status castle__check_queue(const castle_context *ctx, cl_command_queue queue, cl_uint n, const cl_event *list)
{
    if (!queue)
        return castle__fail(CASTLE_ERR_NULL_QUEUE, "the command queue is NULL");
    cl_context qc = NULL;
    cl_device_id qd = NULL;
    cl_int err = clGetCommandQueueInfo(queue, CL_QUEUE_CONTEXT, sizeof qc, &qc, NULL);
    if (err == CL_SUCCESS)
        err = clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof qd, &qd, NULL);
    if (err != CL_SUCCESS)
        return castle__fail((castle_status)err, "the command queue is not valid");
    if (qc != ctx->cl_ctx || qd != ctx->device)
        return castle__fail(CASTLE_ERR_QUEUE_MISMATCH, "the command queue belongs to another %s",
                            qc != ctx->cl_ctx ? "OpenCL context" : "device");
    if ((n > 0) != (list != NULL))
        return castle__fail(CASTLE_ERR_WAIT_LIST, "num_wait_events=%u with a %s wait list", n,
                            list ? "non-NULL" : "NULL");
    for (cl_uint i = 0; i < n; ++i) {
        if (!list[i])
            return castle__fail(CASTLE_ERR_WAIT_LIST, "wait_events[%u] is NULL", i);
        /* an event of another context: an implementation may refuse it at the first enqueue, or (PoCL)
           take it, so that a wait on it never ends; refused here, before anything is enqueued */
        cl_context ec = NULL;
        if (clGetEventInfo(list[i], CL_EVENT_CONTEXT, sizeof ec, &ec, NULL) != CL_SUCCESS)
            return castle__fail(CASTLE_ERR_WAIT_LIST, "wait_events[%u] is not a valid cl_event", i);
        if (ec != ctx->cl_ctx)
            return castle__fail(CASTLE_ERR_WAIT_LIST, "wait_events[%u] belongs to another OpenCL context", i);
        /* an event that ended in an error: the commands after it would never run as the caller meant
           (and PoCL 3.1 aborts the process on such an event in a wait list); one that fails after
           this check is the driver's to report */
        cl_int status = CL_COMPLETE;
        if (clGetEventInfo(list[i], CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, NULL) == CL_SUCCESS &&
            status < 0)
            return castle__fail(CASTLE_ERR_WAIT_LIST, "wait_events[%u] ended in error %d: nothing is enqueued after it",
                                i, (int)status);
    }
    return CASTLE_SUCCESS;
}

/* castle__check_call: the tensors' buffers, then no overlap between a tensor the call writes (bit
   in `writes`) or a buffer it owns and anything else it is given. */
castle_status castle__check_call(const castle_context *ctx, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                 unsigned used, unsigned writes, unsigned rmw, const castle_owned *owned, int nowned)
{
    castle_status st;
    if (nowned < 0 || nowned > CASTLE_MAX_OWNED)
        return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "castle__check_call: %d owned buffers", nowned);
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
        const bool w = writes >> t & 1u, r = !w || (rmw >> t & 1u);
        const unsigned access = (r ? CASTLE_ACCESS_READ : 0u) | (w ? CASTLE_ACCESS_WRITE : 0u);
        if ((used >> t & 1u) && (st = castle__check_buffer(ctx, bufs[t], p->strides[t].s[3], tensor_names[t],
                                                           CASTLE_ERR_BUFFER_TOO_SMALL, access)))
            return st;
    }
    for (int k = 0; k < nowned; ++k)
        if (owned[k].floats && (st = castle__check_buffer(ctx, owned[k].mem, owned[k].floats, owned[k].name,
                                                          owned[k].too_small, CASTLE_ACCESS_READ | CASTLE_ACCESS_WRITE)))
            return st;
    /* Inputs may share memory; an output, or a buffer the call owns, may share memory with nothing.
       Buffers are compared by their root object and byte range, so overlapping sub-buffers are caught
       too; buffers made with CL_MEM_USE_HOST_PTR are also compared by the host memory they use
       (CL_MEM_HOST_PTR, the sub-buffer's origin included), which two distinct cl_mem objects may
       share.  Entries 0 .. COUNT - 1: the tensors; COUNT + k: owned buffer k. */
    enum { N = CASTLE_TENSOR_COUNT + CASTLE_MAX_OWNED };
    struct range {
        cl_mem mem, root;
        const char *name;
        bool used, writes;
        size_t lo, hi;
        uintptr_t host_lo, host_hi; /* 0, 0 unless the buffer uses host memory */
    } r[N];
    for (int t = 0; t < N; ++t) {
        const bool tensor = t < CASTLE_TENSOR_COUNT;
        r[t].used = tensor ? (used >> t & 1u) != 0
                           : t - CASTLE_TENSOR_COUNT < nowned && owned[t - CASTLE_TENSOR_COUNT].mem != NULL;
        if (!r[t].used)
            continue;
        r[t].writes = tensor ? (writes >> t & 1u) != 0 : true;
        r[t].mem = tensor ? bufs[t] : owned[t - CASTLE_TENSOR_COUNT].mem;
        r[t].name = tensor ? tensor_names[t] : owned[t - CASTLE_TENSOR_COUNT].name;
        cl_mem m = r[t].mem, parent = NULL;
        size_t off = 0, size = 0;
        clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, NULL);
        if (clGetMemObjectInfo(m, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof parent, &parent, NULL) != CL_SUCCESS)
            parent = NULL;
        if (parent && clGetMemObjectInfo(m, CL_MEM_OFFSET, sizeof off, &off, NULL) != CL_SUCCESS)
            off = 0;
        r[t].root = parent ? parent : m;
        r[t].lo = off;
        r[t].hi = off + size;
        cl_mem_flags flags = 0;
        void *host = NULL;
        if (clGetMemObjectInfo(r[t].root, CL_MEM_FLAGS, sizeof flags, &flags, NULL) != CL_SUCCESS ||
            !(flags & CL_MEM_USE_HOST_PTR) ||
            clGetMemObjectInfo(m, CL_MEM_HOST_PTR, sizeof host, &host, NULL) != CL_SUCCESS)
            host = NULL;
        r[t].host_lo = (uintptr_t)host;
        r[t].host_hi = host ? (uintptr_t)host + size : 0;
    }
    for (int t = 0; t < N; ++t) {
        if (!r[t].used || !r[t].writes)
            continue;
        const char *kind = t < CASTLE_TENSOR_COUNT ? "output " : "";
        for (int u = 0; u < CASTLE_TENSOR_COUNT; ++u) { /* an owned buffer is compared when t is it */
            if (u == t || !r[u].used)
                continue;
            const bool same_object = r[u].root == r[t].root && r[u].lo < r[t].hi && r[t].lo < r[u].hi;
            const bool same_host = r[u].host_lo && r[t].host_lo && r[u].host_lo < r[t].host_hi &&
                                   r[t].host_lo < r[u].host_hi;
            if (same_object && r[u].mem == r[t].mem)
                return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "%s%s is the same buffer as %s", kind, r[t].name,
                                    r[u].name);
            if (same_object)
                return castle__fail(CASTLE_ERR_INVALID_ARGUMENT, "%s%s overlaps %s (sub-buffers of one buffer)", kind,
                                    r[t].name, r[u].name);
            if (same_host)
                return castle__fail(CASTLE_ERR_INVALID_ARGUMENT,
                                    "%s%s overlaps %s (CL_MEM_USE_HOST_PTR buffers over the same host memory)", kind,
                                    r[t].name, r[u].name);
        }
    }
    return CASTLE_SUCCESS;
}

castle_status castle__check_buffers(const castle_context *ctx, const castle_problem *p,
                                    const cl_mem bufs[CASTLE_TENSOR_COUNT], unsigned used, unsigned writes,
                                    unsigned rmw, cl_mem workspace)
{
    const castle_owned ws = {workspace, "workspace", p->ws_floats, CASTLE_ERR_WORKSPACE_TOO_SMALL};
    return castle__check_call(ctx, p, bufs, used, writes, rmw, &ws, 1);
}

/* ---- UQ-KV cache (docs/algorithm.md section 5) ---- */
castle_status castle__check_cache_desc(const castle_cache *c, const castle_attention_desc *desc,
                                       const castle_problem *p)
{
    /* The first field that differs is named (a scale of 0 means 1/sqrt(head_dim), so a head_dim
       that differs would also show as a scale that differs). */
    const size_t mine[3] = {p->B, p->H, p->d}, its[3] = {c->B, c->H, c->d};
    static const char *const names[3] = {"batch", "heads", "head_dim"};
    for (int k = 0; k < 3; ++k)
        if (mine[k] != its[k])
            return castle__fail(CASTLE_ERR_SHAPE_MISMATCH, "descriptor %s=%zu does not match the cache's %s=%zu",
                                names[k], mine[k], names[k], its[k]);
    if (desc->window != c->window)
        return castle__fail(CASTLE_ERR_SHAPE_MISMATCH, "descriptor window=%ld does not match the cache's window=%ld",
                            desc->window, c->window);
    if (p->scale != c->scale)
        return castle__fail(CASTLE_ERR_SHAPE_MISMATCH,
                            "descriptor scale=%.9g (as used: %.9g) does not match the cache's scale=%.9g",
                            (double)desc->scale, (double)p->scale, (double)c->scale);
    return CASTLE_SUCCESS;
}

/* ---- standard causal attention, the baseline ---- */

castle_status castle__check_kv_cache_desc(const castle_kv_cache *c, const castle_problem *p)
{
    if (p->B != c->B || p->H != c->H || p->d != c->d)
        return castle__fail(CASTLE_ERR_SHAPE_MISMATCH,
                            "descriptor batch=%zu heads=%zu head_dim=%zu does not match the KV cache's batch=%zu "
                            "heads=%zu head_dim=%zu",
                            p->B, p->H, p->d, c->B, c->H, c->d);
    return CASTLE_SUCCESS;
}

castle_status castle__require(const char *fn, const void *a, const char *an, const void *b, const char *bn)
{
    castle__clear_error();
    if (!a)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "%s: %s is NULL", fn, an);
    if (bn && !b)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "%s: %s is NULL", fn, bn);
    return CASTLE_SUCCESS;
}
