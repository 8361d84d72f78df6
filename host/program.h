/* Kernel programs: assembly, lazy compilation, kernels by name (host/program.c). */
#ifndef CASTLE_HOST_PROGRAM_H
#define CASTLE_HOST_PROGRAM_H

#include "castle/castle.h"

#include <stdbool.h>

/* One program per kernel family (one .cl file after common.cl) and tuning. */
typedef enum castle_family {
    CASTLE_FAMILY_FORWARD = 0, /* cl/forward.cl */
    CASTLE_FAMILY_BACKWARD,    /* cl/backward.cl */
    CASTLE_FAMILY_CACHE,       /* cl/cache.cl: prefill and decode with the UQ-KV cache */
    CASTLE_FAMILY_CAUSAL,      /* cl/causal.cl: standard causal attention, the baseline */
    /* cl/causal.cl's forward kernel alone (-DCC_FORWARD_ONLY), under the forwards' own work-group
       size and d chunk; used where they differ from the rest (castle__causal_forward_family) */
    CASTLE_FAMILY_CAUSAL_FORWARD,
    CASTLE_FAMILY_COUNT
} castle_family;

/* A tuning under accum = 2 holds up to 11 programs (forward, backward, and the causal, causal
   forward and cache families at three head-dimension classes) and fewer than 56 kernels; these
   bounds hold four such tunings. */
#define CASTLE_MAX_PROGRAMS 48
#define CASTLE_MAX_PROGRAM_KERNELS 8 /* the most kernels one cl/ program has (causal.cl: 7) */
#define CASTLE_MAX_KERNELS (CASTLE_MAX_PROGRAMS * CASTLE_MAX_PROGRAM_KERNELS) /* every kernel of every program */
typedef struct castle_program_slot {
    castle_family family;
    castle_tuning tuning;
    int dclass; /* castle__head_dim_class */
    cl_program program;
    bool from_cache; /* loaded from the on-disk binary cache (not yet proved by a kernel) */
} castle_program_slot;
typedef struct castle_kernel_slot {
    int program;      /* index into castle_context.programs; -1: its program was rebuilt */
    const char *name; /* static string */
    cl_kernel kernel;
} castle_kernel_slot;

/* Kernel `name` (a static string) of family f under the context's current tuning, for head dim d
   (which selects the program's head-dimension class); the program is built (or loaded from the
   on-disk binary cache) on first use, the kernel created once. */
castle_status castle__get_kernel(castle_context *ctx, castle_family f, size_t d, const char *name, cl_kernel *kernel);
/* As castle__get_kernel for a kernel the program may lack (one that an earlier revision's cl/, loaded
   through CASTLE_CL_DIR, did not have): *kernel = NULL and success where it has no kernel of that name. */
castle_status castle__find_kernel(castle_context *ctx, castle_family f, size_t d, const char *name, cl_kernel *kernel);
/* The widest head the program of family f under t is built for, given head dim d (passed to the
   kernels as CASTLE_HEAD_DIM_CLASS): under accum = 2 the causal and cache families keep d-wide rows
   in registers sized by it, the smallest of 64, 128, 256 that holds d (cl/common.cl, ACC); every
   other program serves every d (CASTLE_MAX_HEAD_DIM). */
int castle__head_dim_class(castle_family f, const castle_tuning *t, size_t d);
/* The last of every program's build options: -w, the OpenCL option that suppresses the compiler's
   warnings.  On a successful build nothing reads them, and PoCL's compiler also writes their count
   to the process's stderr ("65 warnings generated.", on x86 CPUs without AVX-512: notes that a
   16-float argument changes the calling convention), which would make the library print.
   tests/kernel_lint.sh keeps the kernels free of warnings under clang's -Wall -Wextra instead. */
#define CASTLE_BUILD_QUIET " -w"
/* The assembled program source and build options of family f under t for head-dimension class
   dclass (malloc'd; caller frees).  The source is cl/local_memory.h, cl/common.cl and the family's
   file, each after a #line directive naming it, so that build logs and debug lines give file:line.
   The options: -cl-std=CL1.2, one -D option per kernel macro of
   CASTLE_TUNING_PARAMS with the values of castle__family_tuning(f, t), the constants the kernels
   share with the host, then CASTLE_BUILD_QUIET. */
castle_status castle__program_source(castle_family f, const castle_tuning *t, int dclass, char **source,
                                     char **options);
/* The tuning family f's kernels run under: t, with the CASTLE backward's own work-group size and
   micro-tile rows (bthreads, btm) as threads and tm for CASTLE_FAMILY_BACKWARD, and the forwards'
   own work-group size and d chunk (fthreads, fdchunk) as threads and dchunk for
   CASTLE_FAMILY_FORWARD and CASTLE_FAMILY_CAUSAL_FORWARD (tools/ptx-report.sh assembles the
   programs the same way). */
castle_tuning castle__family_tuning(castle_family f, const castle_tuning *t);
/* The family whose program holds the causal forward kernel under t: CASTLE_FAMILY_CAUSAL where the
   forwards' shape is the rest's (fthreads = threads, fdchunk = dchunk: the CPU entries, one program
   fewer to build), else CASTLE_FAMILY_CAUSAL_FORWARD. */
castle_family castle__causal_forward_family(const castle_tuning *t);

/* Embedded .cl sources (generated at build time). */
const char *castle__embedded_source(const char *name);

#endif
