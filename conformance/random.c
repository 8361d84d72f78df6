/* Random conformance cases (conformance/conformance.h, conf_random_case): the table's fixed cases
 * cover what the suites were written to cover; these draw shapes, windows, layouts, scales and call
 * sequences anew from a seed, within the ranges the table spans and the tolerances are stated for.
 * castle-conformance --random N runs N of them per operation. */
#include "conformance.h"

#include <math.h>
#include <string.h>

/* splitmix64: a well-mixed sequence from any 64-bit state, the same on every machine. */
static uint64_t next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* lo .. hi, both included (the bias of the modulus is far below what matters here). */
static size_t pick(uint64_t *s, size_t lo, size_t hi) { return lo + (size_t)(next(s) % (hi - lo + 1)); }

static bool chance(uint64_t *s, unsigned percent) { return next(s) % 100 < percent; }

/* Head dims: half uniform in 1 .. 256, half at the edges of vector widths and head-dimension classes. */
static size_t head_dim(uint64_t *s)
{
    static const size_t edges[] = {1,  2,  3,  4,  5,  7,  8,  9,   15,  16,  17,  31,  32,
                                   33, 47, 48, 63, 64, 65, 96, 127, 128, 129, 192, 255, 256};
    return chance(s, 50) ? pick(s, 1, 256) : edges[pick(s, 0, sizeof edges / sizeof edges[0] - 1)];
}

/* Lengths in lo .. hi: half uniform, half within one of a multiple of 16 (the tunings' blocks are 16,
   32 and 64 rows). */
static size_t length(uint64_t *s, size_t lo, size_t hi)
{
    if (hi < 16 || chance(s, 50))
        return pick(s, lo, hi);
    const size_t edge = 16 * pick(s, 1, hi / 16), L = edge - 1 + pick(s, 0, 2);
    return L < lo ? lo : L > hi ? hi : L;
}

/* Windows for a sequence of L tokens: CASTLE (0) in 40%, else small, near a block, or at and past L. */
static long window(uint64_t *s, size_t L)
{
    switch (pick(s, 0, 4)) {
    case 0:
    case 1:
        return 0;
    case 2:
        return (long)pick(s, 1, 4);
    case 3:
        return (long)(16 * pick(s, 1, 4) - 1 + pick(s, 0, 2));
    default:
        return (long)(L > 1 ? L - 1 + pick(s, 0, 2) : 1);
    }
}

/* The default scale (0) in 60%, else 0.25 .. 2 over sqrt(d). */
static float scale(uint64_t *s, size_t d)
{
    return chance(s, 60) ? 0.0f : (float)((0.25 + 1.75 * (double)pick(s, 0, 1000) / 1000) / sqrt((double)d));
}

static h_layout layout(uint64_t *s)
{
    static const h_layout all[] = {H_BHLD, H_BLHD, H_PADDED};
    return all[pick(s, 0, 2)];
}

/* Batch entries, heads and a length whose B H L d stays within `work` (the reference's cost). */
static void shape(uint64_t *s, size_t Lmin, size_t Lmax, size_t Bmax, size_t work, h_fwd_case *c)
{
    c->B = pick(s, 1, Bmax);
    c->H = pick(s, 1, 3);
    c->d = head_dim(s);
    c->L = length(s, Lmin, Lmax);
    const size_t most = work / (c->B * c->H * c->d);
    if (c->L > most)
        c->L = most > Lmin ? most : Lmin;
}

void conf_random_case(conf_op op, uint64_t seed, size_t k, conf_case *c)
{
    memset(c, 0, sizeof *c);
    c->op = op;
    uint64_t s = seed ^ (0xD1B54A32D192ED03ull * ((uint64_t)k + 1)) ^ ((uint64_t)op << 56);
    next(&s);
    const uint64_t data = next(&s); /* the inputs' seed (h_value) */
    switch (op) {
    case CONF_FORWARD:
    case CONF_BACKWARD:
    case CONF_CAUSAL_FORWARD:
    case CONF_CAUSAL_BACKWARD: {
        h_fwd_case *f = &c->u.fwd;
        const bool backward = op == CONF_BACKWARD || op == CONF_CAUSAL_BACKWARD;
        /* the backward's tolerance holds from L = 3 (conformance/tolerance.h); its reference for
           CASTLE is O(L^3 d), the others' O(L^2 d) */
        shape(&s, op == CONF_BACKWARD ? 3 : 1, op == CONF_BACKWARD ? 120 : 300, 3,
              op == CONF_BACKWARD ? 40000
              : backward          ? 200000
                                  : 400000,
              f);
        f->W = op == CONF_FORWARD || op == CONF_BACKWARD ? window(&s, f->L) : 0;
        f->layout = layout(&s);
        f->mag = 1;
        f->scale = scale(&s, f->d);
        f->seed = data;
        break;
    }
    case CONF_DECODE:
    case CONF_DECODE_CHUNKED: {
        conf_dec_case *d = &c->u.dec;
        d->B = pick(&s, 1, CONF_MAXB);
        d->H = pick(&s, 1, 2);
        d->d = head_dim(&s);
        const bool empty = chance(&s, 20);
        for (size_t b = 0; b < d->B; ++b)
            d->P[b] = empty ? 0 : b && chance(&s, 50) ? d->P[0] : length(&s, 1, 100);
        d->n = pick(&s, 1, 40);
        d->chunk = op == CONF_DECODE ? 1 : pick(&s, 2, 9);
        d->extra_cap = chance(&s, 50) ? 0 : pick(&s, 1, 20);
        d->W = window(&s, conf_decode_capacity(d));
        d->layout = layout(&s);
        d->with_lse = chance(&s, 70);
        d->seed = data;
        break;
    }
    case CONF_CAUSAL_DECODE: {
        conf_causal_dec_case *d = &c->u.cdec;
        shape(&s, 1, 200, CONF_MAXB, 400000, &d->c);
        d->c.layout = layout(&s);
        d->c.mag = 1;
        d->c.scale = scale(&s, d->c.d);
        d->c.seed = data;
        d->P = chance(&s, 20) ? 0 : pick(&s, 1, d->c.L);
        d->chunk = chance(&s, 50) ? pick(&s, 1, 4) : pick(&s, 5, 40); /* the decode kernel, the block kernel */
        d->with_lse = chance(&s, 70);
        break;
    }
    default:
        break;
    }
}
