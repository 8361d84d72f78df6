/*
 * libcastle: CASTLE (Causal Attention with Lookahead Keys) and CASTLE-SWL on any OpenCL 1.2+ device.
 *
 * The mathematics is the project's SPEC.md (Song, Sun, Yuan, Gu, "Causal Attention with Lookahead
 * Keys").  Conventions used throughout this header:
 *   - Tensors are float32, shaped (batch, heads, L, d) and addressed by element strides for batch,
 *     head and row; the last dimension (d) is contiguous.  lse is (batch, heads, L).
 *   - Every call returns a castle_status.  CASTLE_SUCCESS is 0; negative values in the OpenCL range
 *     are OpenCL error codes passed through unchanged; the library's own codes lie in -3000..-3099.
 *     After any failure castle_last_error() gives a one-line message naming the problem.
 *   - Operations take the caller's command queue, an event wait list and an optional output event
 *     (caller-owned, release it with clReleaseEvent).  They return as soon as the work is enqueued.
 *   - The library never prints, aborts or exits.
 *   - A castle_context may be used by one thread at a time.
 */
#ifndef CASTLE_CASTLE_H
#define CASTLE_CASTLE_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(CASTLE_STATIC_DEFINE)
#define CASTLE_API
#elif defined(_WIN32)
#ifdef CASTLE_BUILDING
#define CASTLE_API __declspec(dllexport)
#else
#define CASTLE_API __declspec(dllimport)
#endif
#else
#define CASTLE_API __attribute__((visibility("default")))
#endif

/* ---- Version ------------------------------------------------------------------------------ */
#define CASTLE_VERSION_MAJOR 0
#define CASTLE_VERSION_MINOR 1
#define CASTLE_VERSION_PATCH 0
#define CASTLE_VERSION_NUMBER (CASTLE_VERSION_MAJOR * 10000 + CASTLE_VERSION_MINOR * 100 + CASTLE_VERSION_PATCH)
/* The run-time version, CASTLE_VERSION_NUMBER of the library actually linked. */
CASTLE_API unsigned castle_version_number(void);
CASTLE_API const char *castle_version_string(void);

/* ---- Status codes ------------------------------------------------------------------------- */
typedef enum castle_status {
    CASTLE_SUCCESS = 0,
    /* OpenCL error codes (CL_OUT_OF_RESOURCES, CL_INVALID_COMMAND_QUEUE, ...) pass through as is. */
    CASTLE_ERR_NULL_CONTEXT = -3001,       /* the castle_context argument is NULL */
    CASTLE_ERR_NULL_POINTER = -3002,       /* a required pointer argument (descriptor, out pointer) is NULL */
    CASTLE_ERR_NULL_BUFFER = -3003,        /* a cl_mem argument is NULL */
    CASTLE_ERR_NULL_QUEUE = -3004,         /* the command queue is NULL */
    CASTLE_ERR_DESC_VERSION = -3005,       /* descriptor struct_size is not one this library knows */
    CASTLE_ERR_ZERO_SIZE = -3006,          /* batch, heads, L or d is zero */
    CASTLE_ERR_SIZE_OVERFLOW = -3007,      /* a size computed from the descriptor does not fit */
    CASTLE_ERR_HEAD_DIM = -3008,           /* head dim outside 1..CASTLE_MAX_HEAD_DIM */
    CASTLE_ERR_NEGATIVE_WINDOW = -3009,    /* window < 0 */
    CASTLE_ERR_BAD_SCALE = -3010,          /* scale negative, NaN or infinite */
    CASTLE_ERR_BAD_STRIDE = -3011,         /* a row stride < d, or output rows/heads/batches overlap */
    CASTLE_ERR_BUFFER_TOO_SMALL = -3012,   /* a tensor buffer is smaller than its layout needs */
    CASTLE_ERR_WORKSPACE_TOO_SMALL = -3013,/* workspace smaller than castle_forward_workspace_size() */
    CASTLE_ERR_WAIT_LIST = -3014,          /* wait-list count without a list, or a list with count 0 */
    CASTLE_ERR_QUEUE_MISMATCH = -3015,     /* the queue belongs to another context or device */
    CASTLE_ERR_BUILD_FAILED = -3016,       /* a kernel failed to compile: see castle_build_log() */
    CASTLE_ERR_NO_DEVICE = -3017,          /* no OpenCL platform/device matches the request */
    CASTLE_ERR_BAD_DEVICE_SPEC = -3018,    /* CASTLE_DEVICE or the device string is malformed */
    CASTLE_ERR_DEVICE_UNSUPPORTED = -3019, /* the device lacks something the library needs */
    CASTLE_ERR_OUT_OF_HOST_MEMORY = -3020, /* malloc failed */
    CASTLE_ERR_BAD_TUNING = -3021,         /* a tuning entry is inconsistent or does not fit the device */
    CASTLE_ERR_INVALID_ARGUMENT = -3022    /* any other invalid argument (message says which) */
} castle_status;

/* A static name for any status (library or OpenCL), e.g. "CASTLE_ERR_HEAD_DIM", "CL_OUT_OF_RESOURCES". */
CASTLE_API const char *castle_status_string(castle_status status);
/* The message of the most recent failure on this thread ("" if none).  Valid until the next call
   into the library on this thread. */
CASTLE_API const char *castle_last_error(void);

/* ---- Context ------------------------------------------------------------------------------ */
typedef struct castle_context castle_context;

/* Binds to the caller's OpenCL context and device (both retained until castle_context_destroy). */
CASTLE_API castle_status castle_context_create(cl_context cl_ctx, cl_device_id device, castle_context **out);

/* Convenience: picks a device, creates an OpenCL context and an in-order, profiling-enabled queue
   owned by the castle_context (castle_context_queue).  device_spec is "P:D" (platform P, device D
   on it) or "N" (the N-th device counting across platforms, in platform order); NULL or "" means the
   environment variable CASTLE_DEVICE, and if that is unset, "0:0". */
CASTLE_API castle_status castle_context_create_default(const char *device_spec, castle_context **out);

/* Releases everything the context holds.  Accepts NULL. */
CASTLE_API void castle_context_destroy(castle_context *ctx);

/* The queue created by castle_context_create_default (NULL for castle_context_create). */
CASTLE_API cl_command_queue castle_context_queue(const castle_context *ctx);
CASTLE_API cl_device_id castle_context_device(const castle_context *ctx);
CASTLE_API cl_context castle_context_cl_context(const castle_context *ctx);

/* The compiler log of the most recent kernel build on this context ("" if none).  After
   CASTLE_ERR_BUILD_FAILED it holds the failing build's log. */
CASTLE_API const char *castle_build_log(const castle_context *ctx);

/* ---- Tuning ------------------------------------------------------------------------------- */
/* Block and work-group sizes.  Chosen at context creation from the built-in per-device table
   (vendor -> device -> default), then overridden by the environment variable CASTLE_TUNING
   ("block=32,threads=256,dchunk=32"; missing keys keep their value), then by
   castle_context_set_tuning().  Constraints: block in {8,16,32,64}; threads a multiple of block,
   dividing block*block and block*dchunk, at most the device's work-group size; dchunk in
   {4,8,16,32,64}; the local memory the kernels need must fit the device's. */
typedef struct castle_tuning {
    unsigned block;   /* BLK: rows per block (SPEC section 3) */
    unsigned threads; /* work-items per work-group */
    unsigned dchunk;  /* columns of d staged through local memory per step */
} castle_tuning;
CASTLE_API castle_status castle_context_get_tuning(const castle_context *ctx, castle_tuning *out);
/* Name of the table entry used ("default", "pocl-cpu", ...; "environment"/"api" when overridden). */
CASTLE_API const char *castle_context_tuning_name(const castle_context *ctx);
/* Validates against the device and installs.  Workspaces are sized by the block: a workspace sized
   under one tuning must not be used under another. */
CASTLE_API castle_status castle_context_set_tuning(castle_context *ctx, const castle_tuning *tuning);

/* ---- Attention descriptor ---------------------------------------------------------------- */
#define CASTLE_MAX_HEAD_DIM 256

/* Tensors a descriptor lays out.  QU..VC are the six projections, O the output, LSE the
   log-sum-exp (its row_stride is the stride between positions, usually 1). */
typedef enum castle_tensor {
    CASTLE_TENSOR_QU = 0,
    CASTLE_TENSOR_KU,
    CASTLE_TENSOR_VU,
    CASTLE_TENSOR_QC,
    CASTLE_TENSOR_KC,
    CASTLE_TENSOR_VC,
    CASTLE_TENSOR_O,
    CASTLE_TENSOR_LSE,
    CASTLE_TENSOR_COUNT
} castle_tensor;

/* Element strides.  All three zero means packed (B, H, L, d) (for LSE: packed (B, H, L)). */
typedef struct castle_layout {
    size_t batch_stride;
    size_t head_stride;
    size_t row_stride;
} castle_layout;

typedef struct castle_attention_desc {
    size_t struct_size; /* sizeof(castle_attention_desc); set by castle_attention_desc_init */
    size_t batch;
    size_t heads;
    size_t seq_len;     /* L */
    size_t head_dim;    /* d, 1..CASTLE_MAX_HEAD_DIM */
    long window;        /* 0 = CASTLE; W >= 1 = CASTLE-SWL with lookahead window W */
    float scale;        /* 0 = 1/sqrt(d) */
    castle_layout layout[CASTLE_TENSOR_COUNT];
} castle_attention_desc;

/* Fills struct_size, the shape, window 0, scale 0 and packed layouts. */
CASTLE_API void castle_attention_desc_init(castle_attention_desc *desc, size_t batch, size_t heads,
                                           size_t seq_len, size_t head_dim);
/* Sets every tensor's layout to (B, L, H, d) packed (LSE stays (B, H, L)). */
CASTLE_API void castle_attention_desc_set_blhd(castle_attention_desc *desc);

/* ---- Forward pass ------------------------------------------------------------------------- */
/* Bytes of workspace castle_forward needs for this descriptor on this context (*bytes > 0).  The
   forward writes there the state the backward pass reads (each D_j after its last update). */
CASTLE_API castle_status castle_forward_workspace_size(const castle_context *ctx,
                                                       const castle_attention_desc *desc, size_t *bytes);

/* O = CASTLE(QU, KU, VU, QC, KC, VC) and lse, as SPEC section 1 defines them, computed by the
   blockwise algorithm of SPEC section 3 (one launch for the diagonal blocks, then one per
   off-diagonal).  Buffers are float32 with the descriptor's layouts; o and lse must not overlap
   any input.  workspace must hold castle_forward_workspace_size() bytes. */
CASTLE_API castle_status castle_forward(castle_context *ctx, const castle_attention_desc *desc,
                                        cl_mem qu, cl_mem ku, cl_mem vu, cl_mem qc, cl_mem kc, cl_mem vc,
                                        cl_mem o, cl_mem lse, cl_mem workspace,
                                        cl_command_queue queue, cl_uint num_wait_events,
                                        const cl_event *wait_events, cl_event *event);

#ifdef __cplusplus
}
#endif
#endif /* CASTLE_CASTLE_H */
