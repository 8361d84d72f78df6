/*
 * libcastle: CASTLE (Causal Attention with Lookahead Keys) and CASTLE-SWL on any OpenCL 1.2+ device.
 *
 * What is computed, and how, is described in the repository's docs/algorithm.md (CASTLE is due to
 * Song, Sun, Yuan, Gu, "Causal Attention with Lookahead Keys"); the comments below cite its sections.
 * Building, installing and the environment variables: docs/building.md.  The README is the overview.
 * Conventions used throughout this header (docs/algorithm.md section 6):
 *   - Tensors are float32, shaped (batch, heads, L, d) and addressed by element strides for batch,
 *     head and row; the last dimension (d) is contiguous.  lse is (batch, heads, L).
 *   - Tensors and workspaces are OpenCL buffer objects (an image is CASTLE_ERR_INVALID_ARGUMENT).
 *     An input may not be CL_MEM_WRITE_ONLY, an output not CL_MEM_READ_ONLY; castle_forward's and
 *     castle_prefill's o, castle_backward's gradients and the workspace are read as well as written
 *     (the blockwise passes add into them), so they must be CL_MEM_READ_WRITE (the default).  The
 *     call refuses other flags with CASTLE_ERR_INVALID_ARGUMENT naming the buffer.
 *   - Every call returns a castle_status.  CASTLE_SUCCESS is 0; negative values in the OpenCL range
 *     are OpenCL error codes passed through unchanged; the library's own codes lie in -3000..-3099.
 *     After any failure castle_last_error() gives a one-line message naming the problem.
 *   - Operations take the caller's command queue, an event wait list and an optional output event
 *     (caller-owned, release it with clReleaseEvent).  They return as soon as the work is enqueued.
 *     A call enqueues several commands, each waiting for the one before; the output event is the
 *     last one's, so it completes when the whole call has, but its profiling times cover that
 *     command alone (castle_context_set_launch_observer sees each kernel's event).
 *   - The library never prints, aborts or exits.
 *   - Threads: one castle_context may be used from several threads at once, each call with its own
 *     queue or a shared one (OpenCL queues are thread-safe).  Programs are built, kernels created and
 *     kernel arguments set and enqueued under the context's lock, so concurrent calls never see each
 *     other's arguments; their results are bitwise those of the same calls made one at a time.
 *     Exceptions: castle_context_set_tuning and castle_context_destroy must not overlap any other
 *     call on the context, and a castle_cache or castle_kv_cache takes one call at a time (its calls
 *     run in order anyway).  castle_last_error() is per thread; castle_build_log()'s string stays
 *     valid until castle_context_destroy.  Tested under ThreadSanitizer (tests/test_threads.c).
 */
#ifndef CASTLE_CASTLE_H
#define CASTLE_CASTLE_H

/* The library uses the OpenCL 1.2 API.  Unless the includer has chosen a version, this targets the
   OpenCL headers at 1.2, for every later include of them too (their include guards keep the first
   choice): a program that calls OpenCL 2.0 or 3.0 functions defines CL_TARGET_OPENCL_VERSION (say
   300) before including this header, or includes its OpenCL headers first. */
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
    CASTLE_ERR_BAD_SCALE = -3010,          /* scale negative, NaN, infinite or above CASTLE_MAX_SCALE */
    CASTLE_ERR_BAD_STRIDE = -3011,         /* a row stride < d, or output strides that do not nest (each, in
                                              ascending order, at least the extent of the smaller ones):
                                              rows, heads or batches could overlap */
    CASTLE_ERR_BUFFER_TOO_SMALL = -3012,   /* a tensor buffer is smaller than its layout needs */
    CASTLE_ERR_WORKSPACE_TOO_SMALL = -3013,/* workspace smaller than castle_forward_workspace_size() */
    CASTLE_ERR_WAIT_LIST = -3014,          /* wait-list count without a list, a list with count 0, a NULL event,
                                              an event of another OpenCL context, or one that ended in an
                                              error */
    CASTLE_ERR_QUEUE_MISMATCH = -3015,     /* the queue belongs to another context or device */
    CASTLE_ERR_BUILD_FAILED = -3016,       /* a kernel failed to compile: see castle_build_log() */
    CASTLE_ERR_NO_DEVICE = -3017,          /* no OpenCL platform/device matches the request */
    CASTLE_ERR_BAD_DEVICE_SPEC = -3018,    /* CASTLE_DEVICE or the device string is malformed */
    CASTLE_ERR_DEVICE_UNSUPPORTED = -3019, /* the device lacks something the library needs; also a call
                                              whose work-items would loop past the device's limit
                                              (Mesa's llvmpipe; CASTLE_LOOP_LIMIT) */
    CASTLE_ERR_OUT_OF_HOST_MEMORY = -3020, /* malloc failed */
    CASTLE_ERR_BAD_TUNING = -3021,         /* a tuning entry is inconsistent or does not fit the device */
    CASTLE_ERR_INVALID_ARGUMENT = -3022,   /* any other invalid argument (message says which) */
    CASTLE_ERR_CACHE_FULL = -3023,         /* a prefill or decode would pass the cache's capacity */
    CASTLE_ERR_SHAPE_MISMATCH = -3024,     /* batch, heads, head_dim, window or scale differ from the cache's */
    CASTLE_ERR_CACHE_NOT_EMPTY = -3025,    /* castle_prefill on a cache that holds tokens (reset it first) */
    CASTLE_ERR_WORKSPACE_TOO_LARGE = -3026 /* the workspace exceeds the device's largest allocation */
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

/* Parses a device string as castle_context_create_default reads it: "P:D" gives *platform = P and
   *device = D; "N" (the N-th device counting across platforms) gives *platform = -1, *device = N.
   CASTLE_ERR_BAD_DEVICE_SPEC when malformed. */
CASTLE_API castle_status castle_parse_device_spec(const char *spec, long *platform, long *device);

/* Releases everything the context holds.  Accepts NULL. */
CASTLE_API void castle_context_destroy(castle_context *ctx);

/* The queue created by castle_context_create_default (NULL for castle_context_create). */
CASTLE_API cl_command_queue castle_context_queue(const castle_context *ctx);
CASTLE_API cl_device_id castle_context_device(const castle_context *ctx);
CASTLE_API cl_context castle_context_cl_context(const castle_context *ctx);

/* The compiler log of the most recent kernel build on this context ("" if none).  After
   CASTLE_ERR_BUILD_FAILED it holds the failing build's log (or why the source could not be read).
   The kernels are built with -w, so a successful build's log is usually empty; a program loaded
   from the on-disk cache logs "program binary loaded from the on-disk cache; nothing compiled".
   The string stays valid until castle_context_destroy, even while other threads build. */
CASTLE_API const char *castle_build_log(const castle_context *ctx);

/* Launch observer, for profilers (castle-bench --profile): once set, the library calls
   fn(user, kernel, event, groups, group_size) on the calling thread right after it enqueues each
   kernel on ctx, with the kernel's name (a static string), that launch's event (valid during the
   call: clRetainEvent it to read its profiling times once it completes, on a queue created with
   CL_QUEUE_PROFILING_ENABLE), its number of work-groups and the work-items in each.  Copies and
   fills are not reported.  fn must not call into the library with ctx (its lock is free during the
   call, but the operation that launched is not finished: an operation would run, and call fn again
   from within); castle_context_set_launch_observer(ctx, ...) is refused with
   CASTLE_ERR_INVALID_ARGUMENT from within fn, and from within any observer called inside fn (fn
   may call into the library with another context).  While an observer is set every launch creates
   an event.  fn = NULL removes it.  Setting or removing an observer returns once no call of the previous one is in
   progress on any thread, and none begins after: its user data may then be freed.
   CASTLE_ERR_NULL_CONTEXT when ctx is NULL. */
typedef void (*castle_launch_observer)(void *user, const char *kernel, cl_event event, size_t groups,
                                       size_t group_size);
CASTLE_API castle_status castle_context_set_launch_observer(castle_context *ctx, castle_launch_observer fn,
                                                            void *user);

/* ---- Tuning ------------------------------------------------------------------------------- */
/* Block, work-group, micro-tile and vector sizes.  Chosen at context creation from the built-in
   per-device table (vendor -> device -> default), then the tuning file castle-tune writes
   ($CASTLE_TUNING_FILE, else $XDG_CONFIG_HOME/castle/tuning.tsv, else ~/.config/castle/tuning.tsv;
   the entry for this device name and driver version, if valid), then the environment variable
   CASTLE_TUNING ("block=32,threads=64,dchunk=16,vector=4,tm=2,tn=1,fold=8,decode=2"; missing keys keep
   their value; a key given twice takes the later value, so "<a whole entry>,tm=4" changes one; vector,
   tm, tn, decode, bthreads, btm, stage, accum, fthreads, fdchunk and fregs are re-derived unless
   given), then
   castle_context_set_tuning().

   The kernels split every BLK x BLK product of a block pair (and every BLK x dchunk slab) into
   micro-tiles of tm rows x tn vectors of `vector` columns, one work-item's registers each (CLBlast
   xgemm's MWI x NWI); operands are staged through local memory dchunk columns of d at a time.  The
   CPU mapping is tm = 4, tn = 1 with 16-wide vectors and decode = stage = 1 (prefetch = 1 on PoCL),
   its backward on 16 work-items,
   the GPU mapping tm = 2, tn = 1 with 4-wide vectors, 64 work-items and decode = stage = 2, its
   forwards (CASTLE's and the causal baseline's) on 128 work-items staging 32 columns (fthreads,
   fdchunk), its backward on 2 x 4 tiles (btm = 2) on 128 work-items.
   Constraints: each value a power of two in the range below (fold, regs and fregs: any integer in
   it), 0 where "0 = derive" is said or the flag CASTLE_TUNING_OFF allows it (regs, fregs), and regs
   and fregs 0 unless the device has cl_nv_compiler_options; threads a multiple of block, at most
   the device's work-group size, with threads x tm x tn x vector dividing block*block and
   block*dchunk; tm dividing block; tn x vector dividing block and dchunk; the same for the CASTLE
   backward's bthreads and btm in place of threads and tm, except that bthreads may also be smaller
   than block (the backward may take its own work-group and micro-tile rows: block, dchunk, vector
   and tn, which fix the workspace and the staging, are shared) and that where 7 x dchunk >= 3 x
   block > 3 x dchunk, block*dchunk need not be divided (the backward then shares its d-wide
   products out in slabs of up to block columns), and for the forwards' fthreads and fdchunk in
   place of threads and dchunk (their own work-group size and d chunk); the local memory each family
   of kernels needs must fit the device's; decode = 2 needs work-groups of 128 work-items.  The
   built-in entries leave regs and fregs at 0 (the compiler's choice).

   The parameters, in struct order, declared once: X(field, kernel macro or NULL, smallest value,
   largest value, flags, help).  The library's parser, kernel options and checks, castle-info and
   castle-tune are driven by this list. */
#define CASTLE_TUNING_POW2 1u  /* flag: only powers of two */
#define CASTLE_TUNING_DERIVE 2u /* flag: 0 = derive from the device and the other parameters */
#define CASTLE_TUNING_NOT2 4u   /* flag: 2 is not allowed (no kernel has 2-wide vectors) */
#define CASTLE_TUNING_OFF 8u    /* flag: 0 (off) is allowed besides the range */
#define CASTLE_TUNING_PARAMS(X)                                                                              \
    X(block, "BLK", 8, 64, CASTLE_TUNING_POW2, "rows per block (docs/algorithm.md section 3)")                           \
    X(threads, "NT", 8, 1024, CASTLE_TUNING_POW2, "work-items per work-group")                              \
    X(dchunk, "DT", 4, 64, CASTLE_TUNING_POW2, "columns of d staged through local memory per step")        \
    X(vector, "VW", 1, 16, CASTLE_TUNING_POW2 | CASTLE_TUNING_DERIVE | CASTLE_TUNING_NOT2,                 \
      "SIMD width of a micro-tile column vector: 1, 4, 8 or 16 (0: 16 on CPUs, 1 elsewhere, narrowed)")   \
    X(tm, "TM", 1, 8, CASTLE_TUNING_POW2 | CASTLE_TUNING_DERIVE,                                           \
      "rows of a work-item's micro-tile (0: 1 when vector > 1, else 2, narrowed to fit)")                   \
    X(tn, "TN", 1, 8, CASTLE_TUNING_POW2 | CASTLE_TUNING_DERIVE,                                           \
      "vectors per row of a work-item's micro-tile (0: 1 when vector > 1, else as tm; narrowed to fit)")                                             \
    X(fold, NULL, 0, 1024, 0,                                                                              \
      "sequences of at most fold blocks run the whole wavefront in one launch (one work-group per batch "  \
      "entry and head) when batch x heads >= 2 x the device's compute units; 0 never folds")                \
    X(decode, "DEC", 1, 2, CASTLE_TUNING_DERIVE,                                                           \
      "decode mapping: 1 = a work-item per cache row (SIMD CPUs), 2 = teams of work-items share a row "    \
      "(GPUs) (0: 1 when vector > 1, else 2)")                                                             \
    X(bthreads, NULL, 8, 1024, CASTLE_TUNING_POW2 | CASTLE_TUNING_DERIVE,                                  \
      "work-items per work-group of the CASTLE backward's kernels (0: threads)")                            \
    X(btm, NULL, 1, 8, CASTLE_TUNING_POW2 | CASTLE_TUNING_DERIVE,                                          \
      "rows of the CASTLE backward's micro-tiles (0: tm)")                                                \
    X(stage, "STG", 1, 2, CASTLE_TUNING_DERIVE,                                                            \
      "how the work-items of a group share the copy of a tile into local memory: 1 = a contiguous run "    \
      "each (CPUs: the group reads a tile front to back), 2 = interleaved vectors (GPUs: coalesced) (0: "  \
      "as decode)")                                                                                        \
    X(prefetch, "PFT", 0, 1, 0,                                                                            \
      "1 = software prefetch, a phase ahead, of the rows a block pair updates micro-tile by micro-tile "   \
      "(CPUs whose OpenCL compiler has clang's __builtin_prefetch, as PoCL's; elsewhere the kernels may "  \
      "fail to build)")                                                                                    \
    X(accum, "ACC", 1, 2, CASTLE_TUNING_DERIVE,                                                             \
      "where the causal and decode kernels keep d-wide rows: 1 = arrays for the widest head, one program "  \
      "for every d (CPUs); 2 = registers, a program per head-dimension class (d up to 64, 128, 256), "       \
      "and the CASTLE backward's micro-tile loops unrolled too (GPUs) (0: as decode)")                    \
    X(fthreads, NULL, 8, 1024, CASTLE_TUNING_POW2 | CASTLE_TUNING_DERIVE,                                  \
      "work-items per work-group of the forward kernels, CASTLE's and the causal baseline's (0: threads)")  \
    X(fdchunk, NULL, 4, 64, CASTLE_TUNING_POW2 | CASTLE_TUNING_DERIVE,                                     \
      "columns of d the forward kernels (CASTLE's and the causal baseline's) stage through local memory "  \
      "per step (0: dchunk)")                                                                              \
    X(regs, NULL, 16, 255, CASTLE_TUNING_OFF,                                                              \
      "registers a work-item may hold, at most, in every kernel but the forwards' (NVIDIA's OpenCL: "     \
      "-cl-nv-maxrregcount, on devices with cl_nv_compiler_options; fewer registers, more work-groups "   \
      "resident; 0: the compiler's choice)")                                                               \
    X(fregs, NULL, 16, 255, CASTLE_TUNING_DERIVE | CASTLE_TUNING_OFF,                                      \
      "as regs, for the forward kernels, CASTLE's and the causal baseline's (0: regs)")
typedef struct castle_tuning {
    size_t struct_size; /* sizeof(castle_tuning); castle_context_get_tuning sets it */
#define CASTLE_TUNING_FIELD_(field, macro, lo, hi, flags, help) unsigned field;
    CASTLE_TUNING_PARAMS(CASTLE_TUNING_FIELD_)
#undef CASTLE_TUNING_FIELD_
} castle_tuning;
CASTLE_API castle_status castle_context_get_tuning(const castle_context *ctx, castle_tuning *out);
/* t as "block=32,threads=64,...,fold=8" (every parameter, in CASTLE_TUNING_PARAMS order): the syntax
   of CASTLE_TUNING and of the tuning file.  CASTLE_ERR_INVALID_ARGUMENT when size is too small. */
CASTLE_API castle_status castle_tuning_string(const castle_tuning *t, char *buf, size_t size);
/* The built-in per-device table, in match order (the last entry is the default; castle-info --table
   lists it): entry `index`'s name ("pocl-cpu", "nvidia-gpu", ...) into *name (a static string) and
   its values into *out, and the number of entries into *count; name, out and count may each be NULL.
   CASTLE_ERR_INVALID_ARGUMENT when index >= the number of entries (*count is still set). */
CASTLE_API castle_status castle_tuning_table_entry(size_t index, const char **name, castle_tuning *out, size_t *count);
/* The path of the tuning file the library reads (and castle-tune writes), into path[0 .. size). */
CASTLE_API castle_status castle_tuning_file(char *path, size_t size);
/* Name of the table entry used ("default", "pocl-cpu", ...; "shrunk" when cut down to fit the device;
   "file", "environment" or "api" when overridden). */
CASTLE_API const char *castle_context_tuning_name(const castle_context *ctx);
/* The loop iterations one work-item may run in all on ctx's device, 0 when there is no limit (and for
   a NULL ctx): 65535 on Mesa's llvmpipe, whose compiler ends a work-item's loops there silently, or
   CASTLE_LOOP_LIMIT.  Under a limit the library cuts long loops into more work-groups or launches,
   and refuses with CASTLE_ERR_DEVICE_UNSUPPORTED only what still would not fit (a castle_decode call
   of very many tokens; docs/building.md, CASTLE_LOOP_LIMIT). */
CASTLE_API unsigned long castle_context_loop_limit(const castle_context *ctx);
/* Validates against the device and installs (struct_size must be sizeof(castle_tuning), else
   CASTLE_ERR_DESC_VERSION).  Workspaces are sized by the block: a workspace sized
   under one tuning must not be used under another, and the state a castle_forward leaves in it is
   for a castle_backward under the same tuning (castle_backward refuses, CASTLE_ERR_INVALID_ARGUMENT,
   a workspace that one of the context's last 16 forwards wrote under another tuning).  A context
   keeps every kernel program it builds (one per kernel family, tuning and head-dimension class)
   until it is destroyed, at most 48: a call that needs one more fails with
   CASTLE_ERR_INVALID_ARGUMENT ("more than 48 kernel programs"); a search over many tunings uses a
   context per candidate (as castle-tune does). */
CASTLE_API castle_status castle_context_set_tuning(castle_context *ctx, const castle_tuning *tuning);

/* ---- Attention descriptor ---------------------------------------------------------------- */
#define CASTLE_MAX_HEAD_DIM 256
/* The largest score scale accepted.  Scores scale * q.k are float32: with scales up to 2^16 they
   overflow only when |q.k| passes FLT_MAX / 2^16 (about 5e33), far beyond the magnitudes the library
   is accurate at; a larger scale (FLT_MAX turned most outputs into NaN) is CASTLE_ERR_BAD_SCALE.
   The caller keeps |scale * q.k| below FLT_MAX: past it the outputs are not defined. */
#define CASTLE_MAX_SCALE 65536.0f
/* The most tokens (seq_len) one call of castle_forward, castle_backward or castle_prefill takes:
   their kernels compare token positions as float32, which holds every integer up to 2^24 exactly.
   More is CASTLE_ERR_SIZE_OVERFLOW (castle_forward_workspace_size still reports the size).  A
   cache's capacity, castle_decode and the causal baseline count positions in integers and are not
   bound by it.  Every seq_len (a cache's capacity too) is at most INT_MAX less the tuning's block,
   else CASTLE_ERR_SIZE_OVERFLOW, and so is batch x heads. */
#define CASTLE_MAX_SEQ_LEN 16777216

/* Tensors a descriptor lays out.  QU..VC are the six projections, O the output, LSE the
   log-sum-exp (its row_stride is the stride between positions, usually 1), DO the gradient of the
   loss with respect to O, DQU..DVC the gradients the backward pass writes. */
typedef enum castle_tensor {
    CASTLE_TENSOR_QU = 0,
    CASTLE_TENSOR_KU,
    CASTLE_TENSOR_VU,
    CASTLE_TENSOR_QC,
    CASTLE_TENSOR_KC,
    CASTLE_TENSOR_VC,
    CASTLE_TENSOR_O,
    CASTLE_TENSOR_LSE,
    CASTLE_TENSOR_DO,
    CASTLE_TENSOR_DQU,
    CASTLE_TENSOR_DKU,
    CASTLE_TENSOR_DVU,
    CASTLE_TENSOR_DQC,
    CASTLE_TENSOR_DKC,
    CASTLE_TENSOR_DVC,
    CASTLE_TENSOR_COUNT
} castle_tensor;

/* Element strides.  All three zero means packed (B, H, L, d) (for LSE: packed (B, H, L)).  A call
   checks the layouts of the tensors it takes and no others (castle_forward: QU .. VC, O, LSE; the
   causal calls: QC, KC, VC, O, LSE and their gradients; LSE only where the call is given an lse),
   so a descriptor may leave the rest as they are. */
typedef struct castle_layout {
    size_t batch_stride;
    size_t head_stride;
    size_t row_stride;
} castle_layout;

typedef struct castle_attention_desc {
    size_t struct_size; /* sizeof(castle_attention_desc) as the caller compiled it: set by castle_attention_desc_init */
    size_t batch;
    size_t heads;
    size_t seq_len;     /* L; at most CASTLE_MAX_SEQ_LEN for castle_forward, castle_backward, castle_prefill */
    size_t head_dim;    /* d, 1..CASTLE_MAX_HEAD_DIM */
    long window;        /* 0 = CASTLE; W >= 1 = CASTLE-SWL with lookahead window W */
    float scale;        /* 0 = 1/sqrt(d); else 0 < scale <= CASTLE_MAX_SCALE */
    castle_layout layout[CASTLE_TENSOR_COUNT];
} castle_attention_desc;

/* Fills a descriptor: struct_size, the shape, window 0, scale 0 and packed layouts.  struct_size is
   the size of the caller's castle_attention_desc, as the caller was compiled: the macro
   castle_attention_desc_init passes it, and a binding through an FFI passes the size of its own
   struct.  A size this library does not know (a caller built against another version of this
   header) gets CASTLE_ERR_DESC_VERSION and nothing is written, so the library never writes past the
   caller's struct.  NULL desc: CASTLE_ERR_NULL_POINTER. */
CASTLE_API castle_status castle_attention_desc_init_sized(castle_attention_desc *desc, size_t struct_size,
                                                          size_t batch, size_t heads, size_t seq_len,
                                                          size_t head_dim);
#define castle_attention_desc_init(desc, batch, heads, seq_len, head_dim) \
    castle_attention_desc_init_sized((desc), sizeof(castle_attention_desc), (batch), (heads), (seq_len), (head_dim))
/* Sets every (B, H, L, d) tensor's layout to (B, L, H, d) packed (LSE stays (B, H, L)).  A desc whose
   struct_size this library does not know: CASTLE_ERR_DESC_VERSION, nothing written. */
CASTLE_API castle_status castle_attention_desc_set_blhd(castle_attention_desc *desc);

/* ---- Forward pass ------------------------------------------------------------------------- */
/* Bytes of workspace castle_forward and castle_backward need for this descriptor on this context
   (*bytes > 0): per batch entry and head 12 Lpad d + 3 Lpad (block + 1) floats, Lpad = L rounded up
   to whole blocks of the tuning (docs/algorithm.md section 3), so for small d the block terms
   dominate (d = 1, L = 2, block 64: 13 248 floats).  The forward writes there the state the
   backward pass reads (each D_j after its last update, kept as a float pair so the backward can
   roll it back exactly); the backward uses the rest as scratch and leaves the forward's state
   intact, so it may run again.  A workspace larger than the device's largest allocation (CL_DEVICE_MAX_MEM_ALLOC_SIZE) is
   CASTLE_ERR_WORKSPACE_TOO_LARGE; *bytes still receives its size. */
CASTLE_API castle_status castle_forward_workspace_size(const castle_context *ctx,
                                                       const castle_attention_desc *desc, size_t *bytes);

/* O = CASTLE(QU, KU, VU, QC, KC, VC) and lse, as docs/algorithm.md section 1 defines them, computed by the
   blockwise algorithm of docs/algorithm.md section 3 (a transposition of the inputs, then one launch
   for the diagonal blocks and one per off-diagonal, or, for short sequences with many batch entries
   x heads, the whole wavefront in one launch: the tuning's fold).  Buffers are float32 with the descriptor's layouts; o and lse must not overlap
   each other, any input or the workspace.  workspace must hold castle_forward_workspace_size() bytes. */
CASTLE_API castle_status castle_forward(castle_context *ctx, const castle_attention_desc *desc,
                                        cl_mem qu, cl_mem ku, cl_mem vu, cl_mem qc, cl_mem kc, cl_mem vc,
                                        cl_mem o, cl_mem lse, cl_mem workspace,
                                        cl_command_queue queue, cl_uint num_wait_events,
                                        const cl_event *wait_events, cl_event *event);

/* ---- Backward pass ------------------------------------------------------------------------ */
/* Gradients of a loss with respect to the six projections, given dO = dLoss/dO: the blockwise
   backward of docs/algorithm.md section 4, one launch per anti-diagonal in reverse (k = N-1 .. 0), or
   one for them all where the forward folds.  Inputs: the
   forward's six inputs, o and lse as the forward wrote them, the workspace the forward filled (same
   descriptor, same context tuning) and d_o; inputs may share memory (d_o the buffer of o, say).
   Outputs (overwritten, not accumulated): d_qu .. d_vc, laid out by the descriptor's DQU .. DVC
   layouts; they must not overlap each other, any input or the workspace.
   No atomics: the result is bitwise identical from run to run on a device.  P is recomputed with the
   forward's exact rounding, so large inputs (magnitude 1e4) keep float32 accuracy.  A NaN or Inf at
   token r of QC, KC, VC, QU or d_o leaves d_qc of every earlier token bitwise unchanged, and one in
   QC or d_o every gradient row after r too (and d_qc's other rows); KU and VU enter the forward's
   final D_j, which the backward rolls back by subtraction, so a non-finite value there can reach
   earlier rows (docs/algorithm.md, the end of section 4). */
CASTLE_API castle_status castle_backward(castle_context *ctx, const castle_attention_desc *desc,
                                         cl_mem qu, cl_mem ku, cl_mem vu, cl_mem qc, cl_mem kc, cl_mem vc,
                                         cl_mem o, cl_mem lse, cl_mem workspace, cl_mem d_o,
                                         cl_mem d_qu, cl_mem d_ku, cl_mem d_vu, cl_mem d_qc, cl_mem d_kc, cl_mem d_vc,
                                         cl_command_queue queue, cl_uint num_wait_events,
                                         const cl_event *wait_events, cl_event *event);

/* ---- Inference: the UQ-KV cache (docs/algorithm.md section 5) -------------------------------- */
/* A cache for one layer of a serving loop: for each batch entry and head, the lookahead keys U, and
   QU, KC, VC of every cached token, on the device, with a current length per sequence (sequences of
   one batch may differ in length).  castle_prefill fills it from a prompt, castle_decode appends
   tokens: together they give the outputs of one castle_forward over the whole sequence and leave the
   cache one prefill of all its tokens would leave.  For CASTLE-SWL (window W) QU is a ring of W rows,
   so the cache holds 3 cap d + W d floats per batch entry and head instead of 4 cap d.
   Calls on one cache must run in the order they are made: use one in-order queue, or pass each
   call's event in the next call's wait list.  After an OpenCL failure inside a prefill or decode the
   cache's contents are unspecified: reset it. */
typedef struct castle_cache castle_cache;

/* desc gives batch, heads, head_dim, window and scale; its seq_len is the capacity (the most tokens
   one sequence may hold); its layouts are not used.  The cache starts empty and uses ctx (which must
   outlive it); its buffers live in ctx's OpenCL context. */
CASTLE_API castle_status castle_cache_create(castle_context *ctx, const castle_attention_desc *desc,
                                             castle_cache **out);
/* Releases the cache's buffers.  Accepts NULL. */
CASTLE_API void castle_cache_destroy(castle_cache *cache);
/* Every sequence back to length 0 (host-side only: nothing is enqueued, nothing reallocated). */
CASTLE_API castle_status castle_cache_reset(castle_cache *cache);
/* Device memory the cache holds, bytes: U, QU, KC, VC, the lengths and the decode scratch. */
CASTLE_API castle_status castle_cache_bytes(const castle_cache *cache, size_t *bytes);
/* The current length of each sequence: lengths[0 .. batch). */
CASTLE_API castle_status castle_cache_lengths(const castle_cache *cache, size_t *lengths);

typedef enum castle_cache_tensor {
    CASTLE_CACHE_U = 0, /* lookahead keys: row s = sum_{s < j < length, and j <= s + W if W > 0} G[s,j] vU_j */
    CASTLE_CACHE_QU,    /* a ring: token s in row s % rows (rows = W for CASTLE-SWL, else the capacity) */
    CASTLE_CACHE_KC,
    CASTLE_CACHE_VC
} castle_cache_tensor;
/* The cache's own buffer of one tensor, float32 packed (batch, heads, rows, d): row s of sequence b
   holds token s for s < its length; other rows are unspecified.  For reading (inspection, tests,
   serialisation); the buffer stays the cache's (valid until castle_cache_destroy, not retained).  It
   (or a sub-buffer of it) is no tensor of a castle_prefill or castle_decode on the cache: those
   calls write it, and refuse it with CASTLE_ERR_INVALID_ARGUMENT. */
CASTLE_API castle_status castle_cache_buffer(const castle_cache *cache, castle_cache_tensor tensor,
                                             cl_mem *buffer, size_t *rows);

/* Prefill of an empty cache (else CASTLE_ERR_CACHE_NOT_EMPTY) with a prompt of desc->seq_len = P
   tokens laid out by desc (batch, heads, head_dim, window and scale as the cache's, else
   CASTLE_ERR_SHAPE_MISMATCH).  prompt_lengths: NULL means every sequence has P tokens; otherwise
   sequence b has prompt_lengths[b] <= P tokens (else CASTLE_ERR_INVALID_ARGUMENT).  A sequence
   longer than the capacity is CASTLE_ERR_CACHE_FULL (P may pass it where prompt_lengths keeps every
   sequence within it).  A sequence's later rows (padding) may hold anything, NaN and Inf included:
   they change no output of the first
   prompt_lengths[b] rows, nor the cache, nor any later decode (test_decode checks it).  Writes o
   (and lse, unless NULL) as castle_forward does for the first prompt_lengths[b] rows of each
   sequence (later rows: unspecified values), and the cache: U by the forward's D (docs/algorithm.md
   section 3) or, for sequences shorter than P, by one flash-style gated pass.
   Allocates the forward's part of a workspace for the call: past the device's largest allocation,
   CASTLE_ERR_WORKSPACE_TOO_LARGE. */
CASTLE_API castle_status castle_prefill(castle_context *ctx, castle_cache *cache, const castle_attention_desc *desc,
                                        const size_t *prompt_lengths,
                                        cl_mem qu, cl_mem ku, cl_mem vu, cl_mem qc, cl_mem kc, cl_mem vc,
                                        cl_mem o, cl_mem lse, cl_command_queue queue, cl_uint num_wait_events,
                                        const cl_event *wait_events, cl_event *event);

/* Appends n = desc->seq_len >= 1 tokens to every sequence (their six projections, rows 0..n-1 of
   the inputs) and writes their outputs o (and lse, unless NULL) in rows 0..n-1.  Per token: the
   rank-1 update U[s] += G[s,t] vU_t (rows s >= t - W only for CASTLE-SWL), the append of qU_t, kC_t,
   vC_t, and the attention over the cache: O(t d) work per token, all n tokens in two launches (the
   new tokens' block is a forward pass with the cached U as D, docs/algorithm.md section 5), split
   over the cache rows so that one sequence uses many work-groups; no host round trip, no
   allocation.  A NaN or Inf in a decoded token's inputs never reaches the outputs of
   earlier tokens (masked entries are never read into a product).  Would any sequence
   pass the capacity, returns CASTLE_ERR_CACHE_FULL with nothing enqueued and the cache unchanged.
   Works on an empty cache too (a prompt decoded token by token). */
CASTLE_API castle_status castle_decode(castle_context *ctx, castle_cache *cache, const castle_attention_desc *desc,
                                       cl_mem qu, cl_mem ku, cl_mem vu, cl_mem qc, cl_mem kc, cl_mem vc,
                                       cl_mem o, cl_mem lse, cl_command_queue queue, cl_uint num_wait_events,
                                       const cl_event *wait_events, cl_event *event);
/* ---- end of the UQ-KV cache section ----------------------------------------------------------- */

/* ---- Standard causal attention (baseline) ------------------------------------------------------ */
/* Plain causal softmax attention, the baseline CASTLE is measured against on the same device, with
   the same descriptor, conventions and validation:
       o_t = sum_{s <= t} softmax_s(scale q_t . k_s) v_s,    lse_t = log sum_{s <= t} exp(scale q_t . k_s)
   q, k, v use the descriptor's QC, KC, VC layouts (and are named qc, kc, vc in error messages);
   o, lse the O and LSE layouts; d_o, dq, dk, dv the DO, DQC, DKC, DVC layouts.  scale 0 means
   1/sqrt(d).  window and the U tensors' layouts are ignored (causal attention has no lookahead), as
   are the layouts of the tensors a call does not take (castle_layout), so
   one descriptor serves both CASTLE and its baseline.  FlashAttention-2 style (cl/causal.cl): no
   workspace, O(L d) memory, nominal forward FLOPs 2 d L^2 per batch entry and head (docs/algorithm.md
   section 6), backward without atomics (bitwise reproducible on a device).  Causal in the floating-
   point sense too: a masked key is never read, so a NaN or Inf in the inputs of token r leaves the
   outputs of every earlier token bitwise as they would be without it (forward, prefill, decode). */

/* o and lse (both required) from q, k, v: one launch.  o and lse must not overlap any input. */
CASTLE_API castle_status castle_causal_forward(castle_context *ctx, const castle_attention_desc *desc,
                                               cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse,
                                               cl_command_queue queue, cl_uint num_wait_events,
                                               const cl_event *wait_events, cl_event *event);

/* Gradients of a loss with respect to q, k, v given d_o = dLoss/dO, o and lse as
   castle_causal_forward wrote them.  dq, dk, dv are overwritten (not accumulated) and must not
   overlap each other or any input.  Two launches (dK and dV per key block, then dQ per query block). */
CASTLE_API castle_status castle_causal_backward(castle_context *ctx, const castle_attention_desc *desc,
                                                cl_mem q, cl_mem k, cl_mem v, cl_mem o, cl_mem lse, cl_mem d_o,
                                                cl_mem dq, cl_mem dk, cl_mem dv, cl_command_queue queue,
                                                cl_uint num_wait_events, const cl_event *wait_events,
                                                cl_event *event);

/* A KV cache for decoding with the baseline: K and V of every cached token, for each batch entry and
   head, on the device.  Every sequence of the batch has the same length.  Calls on one cache must
   run in the order they are made (one in-order queue, or each call's event in the next call's wait
   list).  After an OpenCL failure inside a prefill or decode the contents are unspecified: reset. */
typedef struct castle_kv_cache castle_kv_cache;

/* desc gives batch, heads and head_dim; its seq_len is the capacity (tokens per sequence); window,
   scale and layouts are not used.  The cache uses ctx (which must outlive it) and starts empty. */
CASTLE_API castle_status castle_kv_cache_create(castle_context *ctx, const castle_attention_desc *desc,
                                                castle_kv_cache **out);
/* Releases the cache's buffers.  Accepts NULL. */
CASTLE_API void castle_kv_cache_destroy(castle_kv_cache *cache);
/* Back to length 0 (host-side only: nothing is enqueued, nothing reallocated). */
CASTLE_API castle_status castle_kv_cache_reset(castle_kv_cache *cache);
/* Device memory the cache holds, bytes: K, V and the decode scratch. */
CASTLE_API castle_status castle_kv_cache_bytes(const castle_kv_cache *cache, size_t *bytes);
/* Tokens each sequence holds. */
CASTLE_API castle_status castle_kv_cache_length(const castle_kv_cache *cache, size_t *length);

/* Prefill of an empty cache (else CASTLE_ERR_CACHE_NOT_EMPTY) with a prompt of desc->seq_len = P
   tokens: o (and lse, unless NULL) as castle_causal_forward writes them, and K, V appended to the
   cache.  batch, heads and head_dim must be the cache's (else CASTLE_ERR_SHAPE_MISMATCH); scale is
   the descriptor's.  More than the capacity: CASTLE_ERR_CACHE_FULL, nothing enqueued. */
CASTLE_API castle_status castle_causal_prefill(castle_context *ctx, castle_kv_cache *cache,
                                               const castle_attention_desc *desc, cl_mem q, cl_mem k, cl_mem v,
                                               cl_mem o, cl_mem lse, cl_command_queue queue,
                                               cl_uint num_wait_events, const cl_event *wait_events,
                                               cl_event *event);
/* Appends n = desc->seq_len >= 1 tokens (rows 0..n-1 of q, k, v, at positions length..length+n-1)
   and writes their outputs o (and lse, unless NULL) in rows 0..n-1: each new token attends to the
   cache and to the new tokens up to itself.  Two or three launches (append, attention, and the merge
   of partials when the cache's keys are split among work-groups); no host round trip, no
   allocation.  Past the capacity: CASTLE_ERR_CACHE_FULL, nothing enqueued, the cache unchanged.
   Works on an empty cache too. */
CASTLE_API castle_status castle_causal_decode(castle_context *ctx, castle_kv_cache *cache,
                                              const castle_attention_desc *desc, cl_mem q, cl_mem k, cl_mem v,
                                              cl_mem o, cl_mem lse, cl_command_queue queue,
                                              cl_uint num_wait_events, const cl_event *wait_events,
                                              cl_event *event);
/* ---- end of the standard causal attention section --------------------------------------------- */

#ifdef __cplusplus
}
#endif
#endif /* CASTLE_CASTLE_H */
