/* Prefill + decode sequences through the UQ-KV cache (castle_prefill, castle_decode) and the causal
 * baseline's KV cache (castle_causal_prefill, castle_causal_decode), every call's buffers inside guard
 * regions (conformance/conformance.h). */
#include "conformance.h"

#include <stdlib.h>
#include <string.h>

#define SENTINEL 1234.5f /* the harness's guard value */

/* One call's tensors (QU..VC, O, LSE): inputs hold positions base[b] + r (r < rows) of sequence b of
   the case's inputs (h_value(seed, tensor, ...) scaled by mag); outputs start as sentinels. */
typedef struct call_io {
    castle_attention_desc desc;
    size_t rows;
    h_guarded g[8];
    float *host[8];
    bool *used[8];
} call_io;

typedef struct seq {
    size_t B, H, d;
    long W;
    float scale;
    h_layout layout;
    double mag;
    uint64_t seed;
    bool with_lse;
} seq;

static void io_free(call_io *io)
{
    for (int t = 0; t < 8; ++t) {
        h_guarded_release(&io->g[t]);
        free(io->host[t]);
        free(io->used[t]);
    }
}

static bool io_make(castle_context *ctx, cl_command_queue q, const seq *s, const size_t *base, size_t rows,
                    call_io *io)
{
    memset(io, 0, sizeof *io);
    castle_attention_desc_init(&io->desc, s->B, s->H, rows, s->d);
    io->desc.window = s->W;
    io->desc.scale = s->scale;
    h_apply_layout(&io->desc, s->layout);
    io->rows = rows;
    for (int t = 0; t < 8; ++t) {
        if (t == CASTLE_TENSOR_LSE && !s->with_lse)
            continue;
        const size_t width = t == CASTLE_TENSOR_LSE ? 1 : s->d;
        const castle_layout *l = &io->desc.layout[t];
        const size_t span = h_layout_span(l, width, s->B, s->H, rows);
        io->host[t] = malloc(span * sizeof(float));
        io->used[t] = calloc(span, sizeof(bool));
        if (!io->host[t] || !io->used[t])
            return false;
        for (size_t i = 0; i < span; ++i)
            io->host[t][i] = SENTINEL;
        for (size_t b = 0; b < s->B; ++b)
            for (size_t h = 0; h < s->H; ++h)
                for (size_t r = 0; r < rows; ++r)
                    for (size_t e = 0; e < width; ++e) {
                        const size_t o = h_layout_offset(l, width, s->H, rows, b, h, r) + e;
                        io->used[t][o] = true;
                        if (t < 6)
                            io->host[t][o] = (float)(s->mag * h_value(s->seed, (unsigned)t, b, h, base[b] + r, e));
                    }
        if (!h_guarded_create(castle_context_cl_context(ctx), castle_context_device(ctx), &io->g[t], span) ||
            !h_guarded_write(q, &io->g[t], t < 6 ? io->host[t] : NULL))
            return false;
    }
    return true;
}

/* Reads the outputs back into logical o (B, H, Lmax, d) / lse (B, H, Lmax) at positions base[b] + r for
   r < count[b]; false when a guard region changed or an input was written. */
static bool io_collect(cl_command_queue q, const seq *s, call_io *io, const size_t *base, const size_t *count,
                       size_t Lmax, float *o, float *lse)
{
    bool ok = true;
    for (int t = 0; t < 8; ++t)
        if (io->g[t].view) {
            float *before = t < 6 ? malloc(io->g[t].span * sizeof(float)) : NULL;
            if (before)
                memcpy(before, io->host[t], io->g[t].span * sizeof(float));
            ok = h_guarded_read(q, &io->g[t], io->host[t], io->used[t]) && ok;
            if (before) /* an input is read, never written */
                ok = ok && !memcmp(before, io->host[t], io->g[t].span * sizeof(float));
            free(before);
        }
    for (size_t b = 0; b < s->B; ++b)
        for (size_t h = 0; h < s->H; ++h)
            for (size_t r = 0; r < count[b]; ++r) {
                const size_t lo = (b * s->H + h) * Lmax + base[b] + r;
                memcpy(o + lo * s->d,
                       io->host[CASTLE_TENSOR_O] +
                           h_layout_offset(&io->desc.layout[CASTLE_TENSOR_O], s->d, s->H, io->rows, b, h, r),
                       s->d * sizeof(float));
                if (s->with_lse)
                    lse[lo] = io->host[CASTLE_TENSOR_LSE]
                                      [h_layout_offset(&io->desc.layout[CASTLE_TENSOR_LSE], 1, s->H, io->rows, b, h, r)];
            }
    return ok;
}

static cl_mem io_buf(call_io *io, int t) { return io->g[t].view; }

size_t conf_decode_capacity(const conf_dec_case *c)
{
    size_t m = 0;
    for (size_t b = 0; b < c->B; ++b)
        m = c->P[b] + c->n > m ? c->P[b] + c->n : m;
    return m + c->extra_cap;
}

typedef struct target {
    castle_context *ctx;
    cl_command_queue q;
    const seq *s;
    castle_cache *cache; /* the UQ-KV cache, or */
    castle_kv_cache *kv; /* the causal baseline's */
    size_t Lmax;
    float *o, *lse;
    bool guards_ok;
} target;

/* One prefill (lengths: NULL, or the ragged prompt lengths) or decode call of `rows` tokens at
   positions base[b]..; collects count[b] outputs of each sequence. */
static castle_status one_call(target *x, bool prefill, const size_t *lengths, const size_t *base, size_t rows,
                              const size_t *count)
{
    call_io io;
    castle_status st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
    if (io_make(x->ctx, x->q, x->s, base, rows, &io)) {
        cl_mem g[8];
        for (int t = 0; t < 8; ++t)
            g[t] = io_buf(&io, t);
        if (x->kv)
            st = (prefill ? castle_causal_prefill : castle_causal_decode)(x->ctx, x->kv, &io.desc, g[3], g[4], g[5],
                                                                          g[6], g[7], x->q, 0, NULL, NULL);
        else if (prefill)
            st = castle_prefill(x->ctx, x->cache, &io.desc, lengths, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7],
                                x->q, 0, NULL, NULL);
        else
            st = castle_decode(x->ctx, x->cache, &io.desc, g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], x->q, 0,
                               NULL, NULL);
        if (!st)
            x->guards_ok = io_collect(x->q, x->s, &io, base, count, x->Lmax, x->o, x->lse) && x->guards_ok;
    }
    io_free(&io);
    return st;
}

/* A prompt of P[b] tokens (P_max rows; prompt lengths when they differ), then calls of `chunk` tokens
   until every sequence holds P[b] + n. */
static castle_status run_calls(target *x, const size_t *P, size_t n, size_t chunk)
{
    const seq *s = x->s;
    size_t cur[CONF_MAXB] = {0}, Pm = 0;
    bool ragged = false;
    for (size_t b = 0; b < s->B; ++b)
        Pm = P[b] > Pm ? P[b] : Pm;
    for (size_t b = 0; b < s->B; ++b)
        ragged = ragged || P[b] != Pm;
    x->guards_ok = true;
    castle_status st = CASTLE_SUCCESS;
    if (Pm) {
        st = one_call(x, true, ragged ? P : NULL, cur, Pm, P);
        for (size_t b = 0; b < s->B; ++b)
            cur[b] = P[b];
    }
    for (size_t done = 0; !st && done < n;) {
        const size_t k = n - done < chunk ? n - done : chunk, cnt[CONF_MAXB] = {k, k};
        st = one_call(x, false, NULL, cur, k, cnt);
        for (size_t b = 0; b < s->B; ++b)
            cur[b] += k;
        done += k;
    }
    return st;
}

castle_status conf_run_decode(castle_context *ctx, const conf_dec_case *c, float *o, float *lse, bool *guards_ok,
                              castle_cache **keep)
{
    const seq s = {c->B, c->H, c->d, c->W, 0, c->layout, 1, c->seed, c->with_lse};
    const size_t cap = conf_decode_capacity(c);
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, c->B, c->H, cap, c->d);
    desc.window = c->W;
    castle_cache *cache = NULL;
    castle_status st = c->B > CONF_MAXB ? CASTLE_ERR_INVALID_ARGUMENT : castle_cache_create(ctx, &desc, &cache);
    target x = {ctx, castle_context_queue(ctx), &s, cache, NULL, cap, o, lse, true};
    if (!st)
        st = run_calls(&x, c->P, c->n, c->chunk);
    *guards_ok = x.guards_ok;
    if (keep && !st)
        *keep = cache;
    else
        castle_cache_destroy(cache);
    return st;
}

castle_status conf_run_causal_decode(castle_context *ctx, cl_command_queue q, const conf_causal_dec_case *dc,
                                     size_t extra_cap, float *o, float *lse, bool *guards_ok)
{
    const h_fwd_case *c = &dc->c;
    const seq s = {c->B, c->H, c->d, 0, c->scale, c->layout, c->mag, c->seed, dc->with_lse};
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, c->B, c->H, c->L + extra_cap, c->d);
    desc.scale = c->scale;
    castle_kv_cache *kv = NULL;
    castle_status st = c->B > CONF_MAXB ? CASTLE_ERR_INVALID_ARGUMENT : castle_kv_cache_create(ctx, &desc, &kv);
    const size_t P[CONF_MAXB] = {dc->P, dc->P};
    target x = {ctx, q, &s, NULL, kv, c->L, o, lse, true};
    if (!st)
        st = run_calls(&x, P, c->L - dc->P, dc->chunk);
    *guards_ok = x.guards_ok;
    castle_kv_cache_destroy(kv);
    return st;
}
