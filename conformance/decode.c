/* Prefill + decode sequences through the UQ-KV cache (castle_prefill, castle_decode) and the causal
 * baseline's KV cache (castle_causal_prefill, castle_causal_decode), every call's buffers inside guard
 * regions (conformance/conformance.h). */
#include "conformance.h"

#include <stdlib.h>
#include <string.h>

#define SENTINEL 1234.5f /* the harness's guard value */

typedef struct seq {
    size_t B, H, d;
    long W;
    float scale;
    h_layout layout;
    double mag;
    uint64_t seed;
    bool with_lse;
} seq;

void conf_io_free(conf_call_io *io)
{
    for (int t = 0; t < 8; ++t) {
        h_guarded_release(&io->g[t]);
        free(io->host[t]);
        free(io->used[t]);
    }
}

bool conf_io_make(castle_context *ctx, cl_command_queue q, const castle_attention_desc *desc, bool with_lse,
                  const size_t *base, conf_io_value value, const void *user, conf_call_io *io)
{
    memset(io, 0, sizeof *io);
    io->desc = *desc;
    io->with_lse = with_lse;
    const size_t B = desc->batch, H = desc->heads, rows = desc->seq_len, d = desc->head_dim;
    for (int t = 0; t < 8; ++t) {
        if (t == CASTLE_TENSOR_LSE && !with_lse)
            continue;
        const size_t width = t == CASTLE_TENSOR_LSE ? 1 : d;
        const castle_layout *l = &io->desc.layout[t];
        const size_t span = h_layout_span(l, width, B, H, rows);
        io->host[t] = malloc(span * sizeof(float));
        io->used[t] = calloc(span, sizeof(bool));
        if (!io->host[t] || !io->used[t])
            return false;
        for (size_t i = 0; i < span; ++i)
            io->host[t][i] = SENTINEL;
        for (size_t b = 0; b < B; ++b)
            for (size_t h = 0; h < H; ++h)
                for (size_t r = 0; r < rows; ++r)
                    for (size_t e = 0; e < width; ++e) {
                        const size_t o = h_layout_offset(l, width, H, rows, b, h, r) + e;
                        io->used[t][o] = true;
                        if (t < 6)
                            io->host[t][o] = value(user, (unsigned)t, b, h, base[b] + r, r, e);
                    }
        if (!h_guarded_create(castle_context_cl_context(ctx), castle_context_device(ctx), &io->g[t], span) ||
            !h_guarded_write(q, &io->g[t], t < 6 ? io->host[t] : NULL))
            return false;
    }
    return true;
}

bool conf_io_collect(cl_command_queue q, conf_call_io *io, const size_t *base, const size_t *count, size_t Lmax,
                     float *o, float *lse)
{
    const size_t H = io->desc.heads, rows = io->desc.seq_len, d = io->desc.head_dim;
    bool ok = true;
    for (int t = 0; t < 8; ++t)
        if (io->g[t].view) {
            float *before = t < 6 ? malloc(io->g[t].span * sizeof(float)) : NULL;
            if (t < 6 && !before)
                return false;
            if (before)
                memcpy(before, io->host[t], io->g[t].span * sizeof(float));
            ok = h_guarded_read(q, &io->g[t], io->host[t], io->used[t]) && ok;
            if (before) /* an input is read, never written */
                ok = ok && !memcmp(before, io->host[t], io->g[t].span * sizeof(float));
            free(before);
        }
    for (size_t b = 0; b < io->desc.batch; ++b)
        for (size_t h = 0; h < H; ++h)
            for (size_t r = 0; r < count[b]; ++r) {
                const size_t lo = (b * H + h) * Lmax + base[b] + r;
                memcpy(o + lo * d,
                       io->host[CASTLE_TENSOR_O] + h_layout_offset(&io->desc.layout[CASTLE_TENSOR_O], d, H, rows, b, h, r),
                       d * sizeof(float));
                if (io->with_lse)
                    lse[lo] = io->host[CASTLE_TENSOR_LSE]
                                      [h_layout_offset(&io->desc.layout[CASTLE_TENSOR_LSE], 1, H, rows, b, h, r)];
            }
    return ok;
}

cl_mem conf_io_buf(const conf_call_io *io, int t) { return io->g[t].view; }

/* The case's inputs: h_value(seed, tensor, ...) scaled by mag, or h_input_hook's. */
static float seq_value(const void *user, unsigned t, size_t b, size_t h, size_t pos, size_t r, size_t e)
{
    const seq *s = user;
    (void)r;
    const double v = s->mag * h_value(s->seed, t, b, h, pos, e);
    return (float)(h_input_hook ? h_input_hook((int)t, b, h, pos, e, (double)(float)v) : v);
}

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
    const seq *s = x->s;
    castle_attention_desc desc;
    castle_attention_desc_init(&desc, s->B, s->H, rows, s->d);
    desc.window = s->W;
    desc.scale = s->scale;
    h_apply_layout(&desc, s->layout);
    conf_call_io io;
    castle_status st = CASTLE_ERR_OUT_OF_HOST_MEMORY;
    if (conf_io_make(x->ctx, x->q, &desc, s->with_lse, base, seq_value, s, &io)) {
        cl_mem g[8];
        for (int t = 0; t < 8; ++t)
            g[t] = conf_io_buf(&io, t);
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
            x->guards_ok = conf_io_collect(x->q, &io, base, count, x->Lmax, x->o, x->lse) && x->guards_ok;
    }
    conf_io_free(&io);
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
