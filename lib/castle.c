/* The public API layer: argument checks (through lib/validate.c), then dispatch to host/. */
#include "validate.h"
#include "schedule.h"
#include "context.h"
#include "error.h"
#include "tuning.h"

#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)

unsigned castle_version_number(void) { return CASTLE_VERSION_NUMBER; }
const char *castle_version_string(void)
{
    return STR(CASTLE_VERSION_MAJOR) "." STR(CASTLE_VERSION_MINOR) "." STR(CASTLE_VERSION_PATCH);
}

castle_status castle_attention_desc_init_sized(castle_attention_desc *desc, size_t struct_size, size_t batch,
                                               size_t heads, size_t seq_len, size_t head_dim)
{
    castle__clear_error();
    castle_status st = castle__check_desc_size(desc, struct_size, "castle_attention_desc_init");
    if (st != CASTLE_SUCCESS)
        return st;
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->batch = batch;
    desc->heads = heads;
    desc->seq_len = seq_len;
    desc->head_dim = head_dim;
    return CASTLE_SUCCESS;
}

castle_status castle_attention_desc_set_blhd(castle_attention_desc *desc)
{
    castle__clear_error();
    castle_status st = castle__check_desc_size(desc, desc ? desc->struct_size : 0, "castle_attention_desc_set_blhd");
    if (st != CASTLE_SUCCESS)
        return st;
    const size_t d = desc->head_dim, H = desc->heads, L = desc->seq_len;
    for (int t = 0; t < CASTLE_TENSOR_COUNT; ++t) {
        if (t == CASTLE_TENSOR_LSE)
            continue;
        desc->layout[t].row_stride = H * d;
        desc->layout[t].head_stride = d;
        desc->layout[t].batch_stride = L * H * d;
    }
    return CASTLE_SUCCESS;
}

castle_status castle_forward_workspace_size(const castle_context *ctx, const castle_attention_desc *desc,
                                            size_t *bytes)
{
    castle__clear_error();
    castle_problem p;
    castle_status st = castle__check_desc(ctx, desc, &p);
    if (st != CASTLE_SUCCESS)
        return st;
    if (!bytes)
        return castle__fail(CASTLE_ERR_NULL_POINTER, "castle_forward_workspace_size: bytes is NULL");
    *bytes = p.ws_floats * sizeof(float);
    return castle__check_workspace_fits(ctx, *bytes);
}

#define BIT(t) (1u << (t))
#define FORWARD_TENSORS (BIT(CASTLE_TENSOR_LSE + 1) - 1u) /* QU .. VC, O, LSE */
#define BACKWARD_TENSORS (BIT(CASTLE_TENSOR_COUNT) - 1u)
/* d_qu .. d_vc (o, lse are read); the backward adds to them, so it reads them as well */
#define BACKWARD_WRITES (BIT(CASTLE_TENSOR_COUNT) - BIT(CASTLE_TENSOR_DQU))

static bool same_tuning(const castle_tuning *a, const castle_tuning *b)
{
    for (size_t i = 0; i < castle__tuning_nparams; ++i)
        if (castle__tuning_get(a, &castle__tuning_params[i]) != castle__tuning_get(b, &castle__tuning_params[i]))
            return false;
    return true;
}

/* Notes the tuning a forward on workspace ws runs under (castle_context's ws_seen). */
static void ws_note(castle_context *ctx, cl_mem ws)
{
    castle__ctx_lock(ctx);
    unsigned slot = CASTLE_WS_SEEN;
    for (unsigned i = 0; i < CASTLE_WS_SEEN && slot == CASTLE_WS_SEEN; ++i)
        if (ctx->ws_seen[i].ws == ws)
            slot = i;
    if (slot == CASTLE_WS_SEEN) {
        slot = ctx->ws_seen_next;
        ctx->ws_seen_next = (slot + 1) % CASTLE_WS_SEEN;
    }
    ctx->ws_seen[slot].ws = ws;
    ctx->ws_seen[slot].tuning = ctx->tuning;
    castle__ctx_unlock(ctx);
}

/* A backward on ws under the tuning in force: refused where one of the last forwards wrote ws under
   another (the state's layout follows the block and the mapping: the backward read it as its own
   and returned wrong gradients). */
static castle_status ws_check(castle_context *ctx, cl_mem ws)
{
    castle_tuning was, now;
    bool other = false;
    castle__ctx_lock(ctx);
    now = ctx->tuning;
    for (unsigned i = 0; i < CASTLE_WS_SEEN && !other; ++i)
        if (ctx->ws_seen[i].ws == ws && !same_tuning(&ctx->ws_seen[i].tuning, &now)) {
            was = ctx->ws_seen[i].tuning;
            other = true;
        }
    castle__ctx_unlock(ctx);
    if (!other)
        return CASTLE_SUCCESS;
    char a[512], b[512];
    if (castle_tuning_string(&was, a, sizeof a) || castle_tuning_string(&now, b, sizeof b))
        a[0] = b[0] = '\0';
    return castle__fail(CASTLE_ERR_INVALID_ARGUMENT,
                        "castle_backward: the workspace holds the state of a castle_forward under tuning %s, not "
                        "under the context's tuning now, %s: run the forward again under it",
                        a, b);
}

castle_status castle_forward(castle_context *ctx, const castle_attention_desc *desc, cl_mem qu, cl_mem ku, cl_mem vu,
                             cl_mem qc, cl_mem kc, cl_mem vc, cl_mem o, cl_mem lse, cl_mem workspace,
                             cl_command_queue queue, cl_uint num_wait_events, const cl_event *wait_events,
                             cl_event *event)
{
    castle__clear_error();
    castle_problem p;
    castle_status st = castle__check_desc_for(ctx, desc, &p, FORWARD_TENSORS, CASTLE_CHECK_WINDOW | CASTLE_CHECK_SCALE);
    if (st == CASTLE_SUCCESS)
        st = castle__check_castle_len(&p, "castle_forward");
    if (st != CASTLE_SUCCESS)
        return st;
    const cl_mem bufs[CASTLE_TENSOR_COUNT] = {qu, ku, vu, qc, kc, vc, o, lse};
    if ((st = castle__check_buffers(ctx, &p, bufs, FORWARD_TENSORS, CASTLE_WRITES_O_LSE, BIT(CASTLE_TENSOR_O), workspace)) ||
        (st = castle__check_queue(ctx, queue, num_wait_events, wait_events)))
        return st;
    st = castle__schedule_forward(ctx, &p, bufs, workspace, queue, num_wait_events, wait_events, event);
    if (st == CASTLE_SUCCESS)
        ws_note(ctx, workspace);
    return st;
}

castle_status castle_backward(castle_context *ctx, const castle_attention_desc *desc, cl_mem qu, cl_mem ku, cl_mem vu,
                              cl_mem qc, cl_mem kc, cl_mem vc, cl_mem o, cl_mem lse, cl_mem workspace, cl_mem d_o,
                              cl_mem d_qu, cl_mem d_ku, cl_mem d_vu, cl_mem d_qc, cl_mem d_kc, cl_mem d_vc,
                              cl_command_queue queue, cl_uint num_wait_events, const cl_event *wait_events,
                              cl_event *event)
{
    castle__clear_error();
    castle_problem p;
    castle_status st = castle__check_desc(ctx, desc, &p);
    if (st == CASTLE_SUCCESS)
        st = castle__check_castle_len(&p, "castle_backward");
    if (st != CASTLE_SUCCESS)
        return st;
    const cl_mem bufs[CASTLE_TENSOR_COUNT] = {qu, ku, vu, qc, kc, vc, o, lse, d_o, d_qu, d_ku, d_vu, d_qc, d_kc, d_vc};
    if ((st = castle__check_buffers(ctx, &p, bufs, BACKWARD_TENSORS, BACKWARD_WRITES, BACKWARD_WRITES, workspace)) ||
        (st = castle__check_queue(ctx, queue, num_wait_events, wait_events)) || (st = ws_check(ctx, workspace)))
        return st;
    return castle__schedule_backward(ctx, &p, bufs, workspace, queue, num_wait_events, wait_events, event);
}
