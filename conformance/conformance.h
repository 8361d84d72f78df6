/* The conformance case table and its runner: every operation of libcastle run on one device over a
 * table of cases (shapes, CASTLE and CASTLE-SWL windows, layouts, ragged lengths, prompt and chunk
 * sizes) and measured against the fp64 reference with the tolerances of conformance/tolerance.h.
 *
 * The table is defined once (conformance/table.c).  The ctest suites iterate all of it (the full
 * tier); castle-conformance runs it on a user's device, all of it or its quick tier (the cases
 * marked quick: small shapes, every op, layout and window kind). */
#ifndef CASTLE_CONFORMANCE_H
#define CASTLE_CONFORMANCE_H

#include "harness.h"

typedef enum conf_op {
    CONF_FORWARD,         /* castle_forward */
    CONF_BACKWARD,        /* castle_forward then castle_backward */
    CONF_DECODE,          /* castle_prefill then castle_decode, one token per call */
    CONF_DECODE_CHUNKED,  /* the same, several tokens per call */
    CONF_CAUSAL_FORWARD,  /* castle_causal_forward (the baseline) */
    CONF_CAUSAL_BACKWARD, /* castle_causal_forward then castle_causal_backward */
    CONF_CAUSAL_DECODE,   /* castle_causal_prefill then castle_causal_decode */
    CONF_NOPS
} conf_op;
extern const char *const conf_op_names[CONF_NOPS];

/* A forward/backward case and whether it is in the quick tier. */
typedef struct conf_fwd_case {
    h_fwd_case c;
    bool quick;
} conf_fwd_case;

/* Forward: conf_shapes (every L of 1 .. 1000 meets several d of 1 .. 256, windows 0, 1, 3, block,
   100, > L and the three layouts), then conf_forward_large.  Backward: conf_shapes up to
   CONF_BACKWARD_MAX_L (the O(L^3) reference gradients), then conf_backward_extra. */
#define CONF_BACKWARD_MAX_L 300
extern const conf_fwd_case conf_shapes[], conf_forward_large[], conf_backward_extra[];
extern const size_t conf_nshapes, conf_nforward_large, conf_nbackward_extra;

/* A UQ-KV cache case: prompts P[b] (ragged when they differ; 0 = decode from an empty cache), then n
   tokens per sequence, `chunk` per castle_decode call, into a cache of capacity max(P) + n + extra_cap. */
#define CONF_MAXB 2
typedef struct conf_dec_case {
    size_t B, H, d;
    long W;
    size_t P[CONF_MAXB];
    size_t n, chunk, extra_cap;
    h_layout layout;
    bool with_lse;
    uint64_t seed;
    bool quick;
} conf_dec_case;
extern const conf_dec_case conf_decode_cases[];
extern const size_t conf_ndecode_cases;

/* A causal-baseline decode case: the sequence c (c.L tokens, W ignored), a prompt of P, then `chunk`
   tokens per castle_causal_decode call. */
typedef struct conf_causal_dec_case {
    h_fwd_case c;
    size_t P, chunk;
    bool with_lse;
    bool quick;
} conf_causal_dec_case;
extern const conf_fwd_case conf_causal_forward_cases[], conf_causal_backward_cases[];
extern const size_t conf_ncausal_forward_cases, conf_ncausal_backward_cases;
extern const conf_causal_dec_case conf_causal_decode_cases[];
extern const size_t conf_ncausal_decode_cases;

/* One case's verdict. */
typedef struct conf_result {
    double err, tol; /* the case's worst error and its tolerance (err is INFINITY on a failed run) */
    bool pass;       /* err <= tol, guard regions and inputs intact, outputs finite, the run succeeded */
    double seconds;  /* wall time of the case, reference included */
    char what[192];  /* the case, e.g. "B=2 H=3 L=63 d=8 W=3 layout=padded" */
    char why[320];   /* why it failed ("" when it passed) */
} conf_result;

/* Cases of op's table; whether case i is in the quick tier. */
size_t conf_ncases(conf_op op);
bool conf_is_quick(conf_op op, size_t i);
/* The head dim d of case i of op's table (0 past its end). */
size_t conf_head_dim(conf_op op, size_t i);

/* Runs case i of op's table on ctx's queue.  Returns the run's status (CASTLE_SUCCESS also when the
   case failed its tolerance: see r->pass). */
castle_status conf_run(castle_context *ctx, conf_op op, size_t i, conf_result *r);

/* One case of an operation, from the table or the caller's own: fwd for forward, backward and their
   causal counterparts, dec for decode and decode_chunked, cdec for causal_decode. */
typedef struct conf_case {
    conf_op op;
    union {
        h_fwd_case fwd;
        conf_dec_case dec;
        conf_causal_dec_case cdec;
    } u;
} conf_case;
/* Case i of op's table (false past its end). */
bool conf_table_case(conf_op op, size_t i, conf_case *c);
/* Runs c as conf_run runs a table case (r->what describes it). */
castle_status conf_run_case(castle_context *ctx, const conf_case *c, conf_result *r);

/* Case k of op drawn at random from seed (conformance/random.c; the same seed, op and k give the same
   case on every machine): shapes within what the table spans (B and H 1..2 or 3, L 1..300 (120 for
   the O(L^3 d) backward reference), d 1..256 weighted to the edges of its classes and vectors,
   windows 0, small, near a block and past L, the three layouts, the default or an explicit scale of
   0.25 .. 2 over sqrt(d); for the caches ragged or empty prompts, 1 .. 40 tokens one at a time or in
   chunks of 2 .. 9, spare capacity, with and without lse), inputs of magnitude 1. */
void conf_random_case(conf_op op, uint64_t seed, size_t k, conf_case *c);

/* castle_prefill + castle_decode of case c on ctx's queue; o (B, H, cap, d) and lse (B, H, cap) receive
   every output (rows past a sequence's length untouched), cap = conf_decode_capacity(c).  With keep_cache
   the cache is returned in *cache (else destroyed).  guards_ok: false when a write went outside an
   output or an input changed. */
size_t conf_decode_capacity(const conf_dec_case *c);
castle_status conf_run_decode(castle_context *ctx, const conf_dec_case *c, float *o, float *lse, bool *guards_ok,
                              castle_cache **cache);
/* The same for the causal baseline's KV cache (capacity c->c.L + extra_cap), o (B, H, L, d), lse (B, H, L). */
castle_status conf_run_causal_decode(castle_context *ctx, cl_command_queue q, const conf_causal_dec_case *c,
                                     size_t extra_cap, float *o, float *lse, bool *guards_ok);

/* One call's eight tensors (QU, KU, VU, QC, KC, VC, O, LSE) for desc (desc->seq_len rows; LSE only
   with with_lse), each inside guard regions (harness.h): input t < 6 holds value(user, t, b, h,
   base[b] + r, r, e) at row r of sequence b, column e; the outputs start as sentinels.
   conf_io_collect reads the outputs back into logical o (B, H, Lmax, d) and lse (B, H, Lmax) at
   positions base[b] + r for r < count[b], and returns false when a guard region changed or an input
   was written.  conf_io_free releases what conf_io_make made, also after it failed. */
typedef struct conf_call_io {
    castle_attention_desc desc;
    bool with_lse;
    h_guarded g[8];
    float *host[8];
    bool *used[8];
} conf_call_io;
typedef float (*conf_io_value)(const void *user, unsigned t, size_t b, size_t h, size_t pos, size_t r, size_t e);
bool conf_io_make(castle_context *ctx, cl_command_queue q, const castle_attention_desc *desc, bool with_lse,
                  const size_t *base, conf_io_value value, const void *user, conf_call_io *io);
bool conf_io_collect(cl_command_queue q, conf_call_io *io, const size_t *base, const size_t *count, size_t Lmax,
                     float *o, float *lse);
void conf_io_free(conf_call_io *io);
cl_mem conf_io_buf(const conf_call_io *io, int t);

/* The error measure of conformance/tolerance.h: max |got - ref| / max(floor, max |ref|) over n
   elements; INFINITY when got has a non-finite entry. */
double conf_rel_err(const float *got, const double *ref, size_t n, double floor);

#endif
