/* Private declarations shared by lib/ and host/.  Nothing here is installed. */
#ifndef CASTLE_INTERNAL_H
#define CASTLE_INTERNAL_H

#include "castle/castle.h"

#include <stdbool.h>
#include <stddef.h>

/* ---- errors (host/error.c) ---- */
/* Records a formatted message for castle_last_error() and returns status. */
castle_status castle__fail(castle_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void castle__clear_error(void);
/* Wraps an OpenCL error code from call `what` (status passes through unchanged). */
castle_status castle__cl_fail(cl_int err, const char *what);

/* ---- device facts (host/device.c) ---- */
typedef struct castle_device_info {
    char name[256];
    char vendor[256];
    char driver_version[256];
    char device_version[256];
    char platform_version[256];
    char platform_name[256];
    cl_device_type type;
    cl_uint compute_units;
    cl_ulong local_mem_size;
    size_t max_work_group_size;
    cl_ulong global_mem_size;
    cl_ulong max_alloc_size;
    bool fp16, fp64;
    int cl_major, cl_minor;
} castle_device_info;
castle_status castle__query_device(cl_device_id device, castle_device_info *info);

/* ---- tuning (host/tuning.c) ---- */
/* Picks the built-in entry for the device and applies CASTLE_TUNING.  name receives the entry's name. */
castle_status castle__tuning_select(const castle_device_info *info, castle_tuning *out, const char **name);
/* The per-device tuning file: $CASTLE_TUNING_FILE, else $XDG_CONFIG_HOME/castle/tuning.tsv, else
   ~/.config/castle/tuning.tsv.  False when no path can be formed. */
bool castle__tuning_file_path(char *buf, size_t n);
/* Replaces vector = 0 by the device's default width, narrowed until it divides block and dchunk. */
void castle__tuning_resolve(castle_tuning *t, const castle_device_info *info);
/* Checks a tuning against the rules of castle.h and the device limits. */
castle_status castle__tuning_check(const castle_tuning *t, const castle_device_info *info);
/* Bytes of local memory the kernels need under t. */
size_t castle__tuning_local_bytes(const castle_tuning *t);

/* ---- programs (host/program.c) ---- */
/* One program per kernel family (one .cl file after common.cl) and tuning. */
typedef enum castle_family {
    CASTLE_FAMILY_FORWARD = 0, /* cl/forward.cl */
    CASTLE_FAMILY_BACKWARD,    /* cl/backward.cl */
    CASTLE_FAMILY_CACHE,       /* cl/cache.cl: prefill and decode with the UQ-KV cache */
    CASTLE_FAMILY_CAUSAL,      /* cl/causal.cl: standard causal attention, the baseline */
    CASTLE_FAMILY_COUNT
} castle_family;

#define CASTLE_MAX_PROGRAMS 16
#define CASTLE_MAX_KERNELS 64
typedef struct castle_program_slot {
    castle_family family;
    castle_tuning tuning;
    cl_program program;
} castle_program_slot;
typedef struct castle_kernel_slot {
    int program;      /* index into castle_context.programs */
    const char *name; /* static string */
    cl_kernel kernel;
} castle_kernel_slot;

struct castle_context {
    cl_context cl_ctx;
    cl_device_id device;
    cl_command_queue own_queue; /* castle_context_create_default only */
    castle_device_info info;
    castle_tuning tuning;
    const char *tuning_name;
    castle_program_slot programs[CASTLE_MAX_PROGRAMS];
    int num_programs;
    castle_kernel_slot kernels[CASTLE_MAX_KERNELS];
    int num_kernels;
    char *build_log;
};

/* Kernel `name` (a static string) of family f under the context's current tuning; the program is
   built (or loaded from the on-disk binary cache) on first use, the kernel created once. */
castle_status castle__get_kernel(castle_context *ctx, castle_family f, const char *name, cl_kernel *kernel);
/* The assembled program source and build options of family f under t (malloc'd; caller frees). */
castle_status castle__program_source(castle_family f, const castle_tuning *t, char **source, char **options);

/* Embedded .cl sources (generated at build time). */
const char *castle__embedded_source(const char *name);

/* ---- on-disk binary cache (host/bincache.c) ---- */
/* Key parts are hashed together; returns false (silently) when there is no usable entry. */
bool castle__bincache_load(const char *const *key_parts, int nparts, unsigned char **bin, size_t *len);
void castle__bincache_store(const char *const *key_parts, int nparts, const unsigned char *bin, size_t len);

/* ---- validated problem (lib/validate.c) ---- */
/* Workspace regions, each for all batch entries x heads: D_j hi and lo parts as the forward leaves
   them (Lpad x d), the backward's working copy of D (hi, lo) and dD (Lpad x d), the scaled masked
   X[T_i, T_i] blocks (N x BLK x BLK) and the softmax state m, l (Lpad x 2). */
typedef enum castle_ws_region {
    CASTLE_WS_D_HI = 0,
    CASTLE_WS_D_LO,
    CASTLE_WS_W_HI,
    CASTLE_WS_W_LO,
    CASTLE_WS_DD,
    CASTLE_WS_X,
    CASTLE_WS_ML,
    CASTLE_WS_COUNT
} castle_ws_region;

typedef struct castle_problem {
    size_t B, H, L, d;
    long W;
    float scale;
    size_t N, Lpad;                        /* blocks, padded length */
    cl_ulong4 strides[CASTLE_TENSOR_COUNT]; /* batch, head, row, 0 */
    size_t ws_floats;                       /* workspace size, floats */
    size_t ws_off[8];                       /* region offsets, floats, indexed by castle_ws_region */
} castle_problem;

extern const char *const castle__tensor_names[CASTLE_TENSOR_COUNT];
/* Checks the descriptor (shape, window, scale, strides, sizes) under the context's tuning and
   fills p.  The one place a descriptor is validated. */
castle_status castle__check_desc(const castle_context *ctx, const castle_attention_desc *desc, castle_problem *p);
/* Checks that buf is a cl_mem of ctx holding `floats` floats (else too_small). */
castle_status castle__check_buffer(const castle_context *ctx, cl_mem buf, size_t floats, const char *name,
                                   castle_status too_small);
/* Checks every tensor t with bit t of `used` set (non-NULL, this context's, large enough for its
   layout) and the workspace, and that no output shares a buffer with another tensor or the workspace. */
castle_status castle__check_buffers(const castle_context *ctx, const castle_problem *p,
                                    const cl_mem bufs[CASTLE_TENSOR_COUNT], unsigned used, cl_mem workspace);
/* Checks queue (non-NULL, same context and device) and the wait list. */
castle_status castle__check_queue(const castle_context *ctx, cl_command_queue queue, cl_uint n, const cl_event *list);

/* ---- schedules (host/schedule.c) ---- */
/* bufs is indexed by castle_tensor. */
castle_status castle__schedule_forward(castle_context *ctx, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                       cl_mem ws, cl_command_queue queue, cl_uint nwait, const cl_event *wait,
                                       cl_event *event);
castle_status castle__schedule_backward(castle_context *ctx, const castle_problem *p,
                                        const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_mem ws, cl_command_queue queue,
                                        cl_uint nwait, const cl_event *wait, cl_event *event);

/* ---- UQ-KV cache (host/cache.c, lib/cache.c, cl/cache.cl; SPEC section 5) ---- */
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
/* Checks that a prefill or decode descriptor (validated into p) matches the cache's batch, heads,
   head_dim, window and scale (else CASTLE_ERR_SHAPE_MISMATCH). */
castle_status castle__check_cache_desc(const castle_cache *c, const castle_attention_desc *desc,
                                       const castle_problem *p);
/* bufs is indexed by castle_tensor (QU .. VC, O, LSE; lse may be NULL).  lengths: B prompt lengths. */
castle_status castle__schedule_prefill(castle_context *ctx, castle_cache *c, const castle_problem *p,
                                       const size_t *lengths, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                       cl_command_queue queue, cl_uint nwait, const cl_event *wait, cl_event *event);
castle_status castle__schedule_decode(castle_context *ctx, castle_cache *c, const castle_problem *p,
                                      const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                      const cl_event *wait, cl_event *event);
/* ---- end of the UQ-KV cache section ---- */

/* ---- standard causal attention, the baseline (host/causal.c, lib/causal.c, cl/causal.cl) ---- */
/* As castle__check_buffers, for calls without a workspace. */
castle_status castle__check_tensors(const castle_context *ctx, const castle_problem *p,
                                    const cl_mem bufs[CASTLE_TENSOR_COUNT], unsigned used);
struct castle_kv_cache {
    castle_context *ctx;
    size_t B, H, d, cap; /* cap: tokens per sequence */
    size_t len;          /* tokens every sequence holds */
    cl_mem k, v;         /* packed (B, H, cap, d) */
    cl_mem part;         /* decode scratch: split partials, part_floats floats */
    size_t part_floats;
    size_t bytes; /* device bytes of k, v, part */
};
/* Checks a prefill or decode descriptor (validated into p) against the cache's batch, heads and
   head_dim (else CASTLE_ERR_SHAPE_MISMATCH). */
castle_status castle__check_kv_cache_desc(const castle_kv_cache *c, const castle_problem *p);
castle_status castle__kv_cache_alloc(castle_context *ctx, const castle_problem *p, castle_kv_cache **out);
void castle__kv_cache_free(castle_kv_cache *c);
/* bufs is indexed by castle_tensor: QC, KC, VC, O, LSE (forward; lse may be NULL in decode), DO,
   DQC, DKC, DVC (backward). */
castle_status castle__causal_forward(castle_context *ctx, const castle_problem *p, const cl_mem bufs[CASTLE_TENSOR_COUNT],
                                     cl_command_queue queue, cl_uint nwait, const cl_event *wait, cl_event *event);
castle_status castle__causal_backward(castle_context *ctx, const castle_problem *p,
                                      const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                      const cl_event *wait, cl_event *event);
/* Appends p->L tokens to c and writes their outputs (prefill: c empty). */
castle_status castle__causal_decode(castle_context *ctx, castle_kv_cache *c, const castle_problem *p,
                                    const cl_mem bufs[CASTLE_TENSOR_COUNT], cl_command_queue queue, cl_uint nwait,
                                    const cl_event *wait, cl_event *event);
/* ---- end of the causal attention section ---- */

#endif
