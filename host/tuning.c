/* The per-device tuning table (vendor -> device -> default), its checks, its parser and the tuning
 * file.  Every parameter is named once, in castle.h's CASTLE_TUNING_PARAMS; the code below walks
 * that list. */
#define _POSIX_C_SOURCE 200809L
#include "tuning.h"
#include "error.h"
#include "program.h"
#include "bincache.h" /* castle__open_regular */
#include "local_memory.h"

#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const castle_tuning_param castle__tuning_params[] = {
#define CASTLE_PARAM_(field, macro, lo, hi, flags, help) {#field, macro, offsetof(castle_tuning, field), lo, hi, flags},
    CASTLE_TUNING_PARAMS(CASTLE_PARAM_)
#undef CASTLE_PARAM_
};
const size_t castle__tuning_nparams = sizeof castle__tuning_params / sizeof castle__tuning_params[0];

unsigned *castle__tuning_field(castle_tuning *t, const castle_tuning_param *p)
{
    return (unsigned *)(void *)((char *)t + p->offset);
}

unsigned castle__tuning_get(const castle_tuning *t, const castle_tuning_param *p)
{
    return *(const unsigned *)(const void *)((const char *)t + p->offset);
}

void castle__tuning_normalize(castle_tuning *dst, const castle_tuning *src)
{
    castle_tuning t;
    memset(&t, 0, sizeof t); /* padding too: program slots compare tunings with memcmp */
    t.struct_size = sizeof t;
    for (size_t i = 0; i < castle__tuning_nparams; ++i)
        *castle__tuning_field(&t, &castle__tuning_params[i]) = castle__tuning_get(src, &castle__tuning_params[i]);
    memcpy(dst, &t, sizeof t);
}

typedef struct tuning_entry {
    const char *name;
    const char *vendor; /* substring of CL_DEVICE_VENDOR, NULL = any */
    const char *device; /* substring of CL_DEVICE_NAME, NULL = any */
    cl_device_type type;
    castle_tuning tuning;
} tuning_entry;

/* The two kernel mappings (castle.h, "Tuning").  CPU: 4 rows x one 16-wide vector per work-item
   (SIMD across a row, no horizontal sums; a vector of B serves 4 FMAs) of 64 x 64 blocks, d staged
   64 columns at a time.  A 64 x 64 block pair does four times the arithmetic of a 32 x 32 one for
   twice the memory traffic.  On PoCL (2-core x86-64, castle-bench L=2048 H=8 d=64, ms, two
   alternating rounds) against the former entry block=32,threads=64,dchunk=32,tm=1: CASTLE forward
   190 / 196 against 410 / 496, backward 572 / 589 against 719 / 860, prefill 195 / 195 against
   423 / 542, the causal forward 52 / 54 against 53 / 59; tm = 1 at block 64 took 202 / 196 (forward)
   and 610 / 599 (backward), tm = 2 x tn = 2 and block 128 were slower.  The backward runs its 64
   micro-tiles on 16 work-items, four each (bthreads = 16): PoCL keeps every value a work-item carries
   across a barrier in a per-work-item slot, and the backward carries many (accumulators, their
   addresses); paired runs on a 2-core Xeon VM, L = 1024 / 2048, H = 8, 12 rounds each, median ratio
   of the backward's times against 64 work-items: 0.80 and 0.84 (32 work-items: 0.86 at L = 1024; 8
   as 16: 0.98).  GPU:
   2 x 4 register micro-tiles (tm = 2 rows x one float4), 64 work-items of 32 x 32 blocks, d staged
   16 columns at a time (the backward's local memory, 46.3 KiB, fits 48 KiB; dchunk 32 would not),
   float4 staging, and the decode kernels' team mapping (decode = 2).  On an NVIDIA H200
   (castle-bench B=2 H=16 L=4096 d=64, 2026-11-26, one run, ms, forward / backward / causal forward /
   causal backward): this entry 24.7 / 107.8 / 7.1 / 30.2; the former entry (2 x 2 scalar tiles,
   128 work-items) 32.3 / 161.0 / 8.9 / 34.3 with these kernels (33.6 / 123.4 / 8.9 / 34.2
   before the micro-tile loops were unrolled, which raised its backward's registers); vector = 4
   with tm = tn = 1 and 128 work-items 27.9 / 88.3 / 10.0 / 37.3 (the fastest backward, the slower
   forward); 2 x 4 scalar tiles with 64 work-items 33.5 / 167 (scalar staging); 4 x 4 with 32
   work-items 46.3 / 271.  The backward runs the last shape's 1 x 4 tiles on 128 work-items
   (bthreads, btm): with its loops rolled, as they are, that shape's backward took 91.3 ms in
   another run that day, so about 91 is expected beside the forward's 24.7 (not measured
   together); 77.6 in the fourth GPU session.  Since 2026-11-29 it runs 2 x 4 tiles on 128
   work-items instead (btm = 2, which share the d-wide products out over 32 x 32 slabs,
   CASTLE_BW_SLAB), not yet timed on a GPU: bitwise the same results, half the local loads per FMA
   (Oclgrind), 0.67 times the instructions and 0.46 times the shared-memory wavefronts of btm = 1
   (tools/oclgrind-banks.sh: 2.04 times the forward's against 4.45; the H200's 4.76 was measured
   under btm = 1), and its launches off the diagonal (castle_backward_off) fit 128 registers in
   clang's PTX (docs/performance.md, ninth session).  The
   forward runs on 128 work-items staging 32 columns of d (fthreads, fdchunk: one 2 x 4 tile of each
   product per work-item, two d steps instead of four; 23 KiB of local memory): on the H200
   (2026-11-27, same shape, one run) 16.4 ms against 22.0 on the shared 64 / 16 (L = 1024
   1.40 against 1.82, L = 8192 59.5 against 80.9); 128 / 32 with tm = 1 took 23.0, 128 / 16 with
   tm = 1 23.5, 256 / 32 with tm = 1 28.5, 64 / 32 21.7, 128 / 64 21.1, 64 / 64 32.6.  The causal
   forward runs on the same shape since 2026-11-28 (from a program without the causal backward,
   whose local memory at d chunk 32 would be 60.3 KiB; 42.4 KiB for the forward alone): not yet
   measured on a GPU, its kernel at 5.58 ms on the shared 64 / 16 (2.39 times PyTorch's fp32 SDPA).
   docs/performance.md has the rest. */
#define CPU_MAPPING .block = 64, .threads = 64, .dchunk = 64, .vector = 16, .tm = 4, .tn = 1, .bthreads = 16
#define GPU_MAPPING                                                                                     \
    .block = 32, .threads = 64, .dchunk = 16, .vector = 4, .tm = 2, .tn = 1, .decode = 2, .bthreads = 128, .btm = 2, \
    .fthreads = 128, .fdchunk = 32

/* First match wins; the last entry is the default.  Values were measured with castle-bench on the
   devices named; how a tuning is chosen and overridden: docs/building.md, "Tuning". */
static const tuning_entry table[] = {
    /* PoCL's compiler has __builtin_prefetch (prefetch = 1: docs/performance.md) */
    {"pocl-cpu", NULL, "pthread", CL_DEVICE_TYPE_CPU, {sizeof(castle_tuning), CPU_MAPPING, .fold = 8, .prefetch = 1}},
    /* Mesa's rusticl on llvmpipe: 32 KiB of local memory, and its compiler takes minutes over the
       backward under 16-wide vectors (the CPU mapping shrunk to block 16: over 14 minutes for
       castle-run backward at L = 150); 2 x 2 scalar tiles compile and run it in 20 s.  A CPU: its
       d-wide rows stay in arrays (accum = 1; scalar tiles would derive the GPUs' 2). */
    {"rusticl-llvmpipe", "Mesa", "llvmpipe", CL_DEVICE_TYPE_CPU,
     {sizeof(castle_tuning), .block = 16, .threads = 64, .dchunk = 16, .vector = 1, .tm = 2, .tn = 2, .fold = 8,
      .accum = 1}},
    {"cpu", NULL, NULL, CL_DEVICE_TYPE_CPU, {sizeof(castle_tuning), CPU_MAPPING, .fold = 8}},
    {"nvidia-gpu", "NVIDIA", NULL, CL_DEVICE_TYPE_GPU, {sizeof(castle_tuning), GPU_MAPPING, .fold = 8}},
    {"amd-gpu", "Advanced Micro Devices", NULL, CL_DEVICE_TYPE_GPU, {sizeof(castle_tuning), GPU_MAPPING, .fold = 8}},
    {"intel-gpu", "Intel", NULL, CL_DEVICE_TYPE_GPU, {sizeof(castle_tuning), GPU_MAPPING, .fold = 8}},
    {"default", NULL, NULL, CL_DEVICE_TYPE_ALL, {sizeof(castle_tuning), GPU_MAPPING, .fold = 8}},
};

size_t castle__tuning_table_size(void) { return sizeof table / sizeof table[0]; }

/* What the rest of a tuning decides, whatever the device, where it is 0: decode (1 under SIMD
   vectors, vector > 1, else 2), the backward's bthreads and btm (threads and tm), the forward's
   fthreads, fdchunk and fregs (threads, dchunk and regs), stage and accum (decode). */
static void derive_rest(castle_tuning *t)
{
    if (!t->decode && t->vector)
        t->decode = t->vector > 1 ? 1u : 2u;
    if (!t->bthreads)
        t->bthreads = t->threads;
    if (!t->btm)
        t->btm = t->tm;
    if (!t->fthreads)
        t->fthreads = t->threads;
    if (!t->fdchunk)
        t->fdchunk = t->dchunk;
    if (!t->fregs)
        t->fregs = t->regs;
    if (!t->stage)
        t->stage = t->decode; /* both say SIMD CPU (1) or GPU (2) */
    if (!t->accum)
        t->accum = t->decode; /* the same */
}

const char *castle__tuning_table_entry(size_t i, castle_tuning *out)
{
    castle__tuning_normalize(out, &table[i].tuning);
    derive_rest(out); /* as a context using the entry has it */
    return table[i].name;
}

/* Whether the micro-tile shape divides the block and the d chunk (threads = 0 counts as 1). */
static bool tile_fits(const castle_tuning *t)
{
    const unsigned b = t->block, c = t->dchunk, n = t->threads ? t->threads : 1;
    const unsigned cols = t->tn * t->vector, unit = t->tm * cols;
    return b % t->tm == 0 && b % cols == 0 && c % cols == 0 && (b * b) % unit == 0 && (b * c) % unit == 0 &&
           ((b * b) / unit) % n == 0 && ((b * c) / unit) % n == 0;
}

/* The backward's shape (cl/backward.cl): whole micro-tiles per work-item of each block product and
   of each slab of its d-wide products, CASTLE_BW_SLAB columns (local_memory.h): dchunk, or wider
   where dchunk gives a work-item none, which needs the backward's wide phase D1. */
static bool backward_fits(const castle_tuning *t)
{
    castle_tuning slab = *t;
    slab.dchunk = CASTLE_BW_SLAB(t->block, t->dchunk, t->threads, t->tm, t->tn * t->vector);
    return tile_fits(&slab) && (slab.dchunk == t->dchunk || CASTLE_BW_D1_WIDE(t->block, t->dchunk));
}

/* The forward's shape (cl/forward.cl, under fthreads and fdchunk): whole blocks of rows per
   work-group and whole micro-tiles per work-item of each product. */
static bool forward_fits(const castle_tuning *fw) { return fw->threads % fw->block == 0 && tile_fits(fw); }

/* Whether every parameter is at most its largest value (castle.h): then tile_fits's products cannot
   wrap around (tn x vector = 2^32 would be 0, and b % 0 a division by zero). */
static bool bounded(const castle_tuning *t)
{
    for (size_t i = 0; i < castle__tuning_nparams; ++i)
        if (castle__tuning_get(t, &castle__tuning_params[i]) > castle__tuning_params[i].hi)
            return false;
    return true;
}

/* Whether the micro-tile fits every kernel's shape: the block products' (threads, dchunk), the
   backward's (bthreads, btm) and the forward's (fthreads, fdchunk), those not given derived as
   castle__tuning_resolve will derive them. */
static bool all_shapes_fit(const castle_tuning *given)
{
    castle_tuning t = *given;
    derive_rest(&t);
    const castle_tuning bw = castle__family_tuning(CASTLE_FAMILY_BACKWARD, &t);
    const castle_tuning fw = castle__family_tuning(CASTLE_FAMILY_FORWARD, &t);
    return tile_fits(&t) && backward_fits(&bw) && forward_fits(&fw);
}

/* castle__tuning_resolve's vector, tm and tn. */
static void resolve_tile(castle_tuning *t, const castle_device_info *info)
{
    const bool dv = !t->vector, dm = !t->tm, dn = !t->tn;
    const bool cpu = info && (info->type & CL_DEVICE_TYPE_CPU);
    if (dv)
        t->vector = cpu ? 16u : 1u;
    if (dm)
        t->tm = t->vector > 1 ? 1u : 2u;
    if (dn)
        t->tn = dm ? t->tm : (t->vector > 1 ? 1u : t->tm);
    if (t->block == 0 || t->dchunk == 0 || t->tm == 0 || t->tn == 0 || t->vector == 0 || !bounded(t))
        return; /* castle__tuning_check rejects it */
    /* narrow what was derived (tn, then tm, then the vector) until the tile fits every kernel's
       shape (a given fdchunk = 8 narrows a derived vector of 16 as a dchunk = 8 does) */
    while (!all_shapes_fit(t)) {
        if (dn && t->tn > 1)
            t->tn /= 2;
        else if (dm && t->tm > 1)
            t->tm /= 2;
        else if (dv && t->vector > 1)
            t->vector = t->vector == 4 ? 1u : t->vector / 2;
        else
            break;
    }
}

/* Derives vector, tm and tn where they are 0 (the device's mapping, narrowed until the tile fits),
   then decode where it is 0 (1 under SIMD vectors, else 2), the backward's bthreads and btm where
   they are 0 (threads and tm), and stage and accum where they are 0 (decode). */
void castle__tuning_resolve(castle_tuning *t, const castle_device_info *info)
{
    resolve_tile(t, info);
    derive_rest(t); /* after the vector and tm are final */
}

size_t castle__tuning_local_bytes(const castle_tuning *t)
{
    return sizeof(float) *
           (size_t)CASTLE_LM_ANY((size_t)t->block, (size_t)t->dchunk, (size_t)t->fdchunk, (size_t)CASTLE_MAX_HEAD_DIM);
}

static bool is_pow2(unsigned v) { return v && !(v & (v - 1)); }

/* Whether a work-group size (tuning parameter name = n) fits the device (none given: it does). */
static castle_status check_group_size(const char *name, unsigned n, const castle_device_info *info)
{
    if (info && n > info->max_work_group_size)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning %s=%u exceeds the device's max work-group size %zu", name,
                            n, info->max_work_group_size);
    return CASTLE_SUCCESS;
}

castle_status castle__tuning_check(const castle_tuning *t, const castle_device_info *info)
{
    for (size_t i = 0; i < castle__tuning_nparams; ++i) {
        const castle_tuning_param *p = &castle__tuning_params[i];
        const unsigned v = castle__tuning_get(t, p);
        const bool off = v == 0 && (p->flags & CASTLE_TUNING_OFF);
        if (!off && (v < p->lo || v > p->hi || ((p->flags & CASTLE_TUNING_POW2) && !is_pow2(v)) ||
                     ((p->flags & CASTLE_TUNING_NOT2) && v == 2)))
            return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning %s=%u: must be %s%s from %u to %u", p->name, v,
                                (p->flags & CASTLE_TUNING_OFF) ? "0 or " : "",
                                (p->flags & CASTLE_TUNING_NOT2)   ? "a power of two other than 2"
                                : (p->flags & CASTLE_TUNING_POW2) ? "a power of two"
                                                                  : "an integer",
                                p->lo, p->hi);
    }
    const unsigned b = t->block, n = t->threads, c = t->dchunk, v = t->vector;
    if (n % b)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning threads=%u: must be a multiple of block=%u", n, b);
    if (b % t->tm || b % (t->tn * v) || c % (t->tn * v))
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning tm=%u, tn=%u x vector=%u: tm must divide block=%u, tn x vector must divide block "
                            "and dchunk=%u",
                            t->tm, t->tn, v, b, c);
    if (!tile_fits(t))
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning threads=%u x tm=%u x tn=%u x vector=%u must divide block*block=%u and "
                            "block*dchunk=%u",
                            n, t->tm, t->tn, v, b * b, b * c);
    const castle_tuning bw = castle__family_tuning(CASTLE_FAMILY_BACKWARD, t);
    if (!backward_fits(&bw)) /* powers of two: bthreads is a multiple or a divisor of block */
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning bthreads=%u x btm=%u (the backward's work-group and micro-tile rows) x tn=%u x "
                            "vector=%u: btm must divide block=%u, the product must divide block*block=%u, and it must "
                            "divide block*dchunk=%u unless 7 x dchunk >= 3 x block (the backward then shares its "
                            "d-wide products out in wider slabs)",
                            bw.threads, bw.tm, t->tn, v, b, b * b, b * c);
    const castle_tuning fw = castle__family_tuning(CASTLE_FAMILY_FORWARD, t);
    if (!forward_fits(&fw))
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning fthreads=%u, fdchunk=%u (the forward's work-group and d chunk) x tm=%u x tn=%u x "
                            "vector=%u: fthreads must be a multiple of block=%u, tn x vector must divide fdchunk, and "
                            "fthreads x the tile must divide block*block=%u and block*fdchunk=%u",
                            fw.threads, fw.dchunk, t->tm, t->tn, v, b, b * b, b * fw.dchunk);
    castle_status st;
    if ((st = check_group_size("fthreads", fw.threads, info)) != CASTLE_SUCCESS ||
        (st = check_group_size("bthreads", bw.threads, info)) != CASTLE_SUCCESS)
        return st;
    if (info && t->decode == 2 && info->max_work_group_size < 128)
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning decode=2 runs work-groups of 128 work-items; the device's max work-group size is %zu",
                            info->max_work_group_size);
    if ((st = check_group_size("threads", n, info)) != CASTLE_SUCCESS)
        return st;
    if (info && (t->regs || t->fregs) && !info->nv_options)
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning regs=%u, fregs=%u: a register cap needs NVIDIA's OpenCL compiler option "
                            "-cl-nv-maxrregcount (the extension cl_nv_compiler_options), which this device lacks; "
                            "0 leaves the registers to the compiler",
                            t->regs, t->fregs);
    size_t lb = castle__tuning_local_bytes(t);
    if (info && lb > info->local_mem_size)
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning block=%u dchunk=%u fdchunk=%u needs %zu bytes of local memory; the device has %llu",
                            b, c, t->fdchunk, lb, (unsigned long long)info->local_mem_size);
    return CASTLE_SUCCESS;
}

/* Parses "key=value[,key=value...]" (keys: the fields of CASTLE_TUNING_PARAMS) over *t.  Values are
   decimal digits only: a sign, an empty value or one above UINT_MAX makes the string malformed, and
   so does a comma with no key after it.  A key given twice takes its later value (castle.h), so that
   "<a whole entry>,tm=4" changes one.  Returns NULL, or where in s the malformed element starts. */
static const char *parse_tuning(const char *s, castle_tuning *t)
{
    while (*s) {
        const char *eq = strchr(s, '='), *at = s;
        if (!eq)
            return at;
        const castle_tuning_param *p = NULL;
        for (size_t i = 0; i < castle__tuning_nparams && !p; ++i)
            if (strlen(castle__tuning_params[i].name) == (size_t)(eq - s) &&
                !strncmp(s, castle__tuning_params[i].name, (size_t)(eq - s)))
                p = &castle__tuning_params[i];
        if (!p)
            return at;
        s = eq + 1;
        if (*s < '0' || *s > '9')
            return at;
        unsigned long long v = 0;
        for (; *s >= '0' && *s <= '9'; ++s) {
            v = v * 10 + (unsigned)(*s - '0');
            if (v > UINT_MAX)
                return at;
        }
        *castle__tuning_field(t, p) = (unsigned)v;
        if (*s == ',' && s[1]) /* a comma starts another key: "block=16," is malformed */
            ++s;
        else if (*s)
            return at;
    }
    return NULL;
}

/* Parses s over *t, re-deriving the derivable parameters (castle.h's CASTLE_TUNING_DERIVE) unless s
   gives them; *t is unchanged where s is malformed (the return value: parse_tuning's). */
static const char *parse_over(const char *s, castle_tuning *t)
{
    castle_tuning u = *t;
    for (size_t i = 0; i < castle__tuning_nparams; ++i)
        if (castle__tuning_params[i].flags & CASTLE_TUNING_DERIVE)
            *castle__tuning_field(&u, &castle__tuning_params[i]) = 0;
    const char *bad = parse_tuning(s, &u);
    if (!bad)
        *t = u;
    return bad;
}

bool castle__tuning_file_path(char *buf, size_t n)
{
    const char *f = getenv("CASTLE_TUNING_FILE");
    int w;
    if (f && *f)
        w = snprintf(buf, n, "%s", f);
    else if ((f = getenv("XDG_CONFIG_HOME")) && *f)
        w = snprintf(buf, n, "%s/castle/tuning.tsv", f);
    else if ((f = getenv("HOME")) && *f)
        w = snprintf(buf, n, "%s/.config/castle/tuning.tsv", f);
    else
        return false;
    return w > 0 && (size_t)w < n;
}

/* The tuning file's entry for this device and driver, if there is a valid one.  Lines:
   "<device name>\t<driver version>\tblock=..,threads=..,..."; a line that starts with '#' is a comment
   (a '#' later in a line is not: such an entry is malformed, as is one with a trailing blank).  An unreadable
   file, an overlong line or a malformed or unfitting entry is ignored; at most
   CASTLE__TUNING_FILE_MAX bytes are read. */
static bool from_file(const castle_device_info *info, castle_tuning *out)
{
    char path[4096], line[1024];
    if (!castle__tuning_file_path(path, sizeof path))
        return false;
    /* a regular file only: a FIFO, a device (/dev/zero) or a directory is not read, nor waited on */
    FILE *f = castle__open_regular(path, CASTLE__TUNING_FILE_MAX, NULL, NULL);
    if (!f)
        return false;
    bool found = false;
    size_t total = 0;
    while (!found && total <= CASTLE__TUNING_FILE_MAX && fgets(line, sizeof line, f)) {
        const size_t len = strlen(line);
        total += len;
        if (len == sizeof line - 1 && line[len - 1] != '\n') { /* overlong: skip the rest of it */
            int ch;
            while ((ch = fgetc(f)) != EOF && ch != '\n' && ++total <= CASTLE__TUNING_FILE_MAX)
                ;
            continue;
        }
        line[strcspn(line, "\r\n")] = '\0';
        if (line[0] == '#' || !line[0])
            continue;
        char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
        if (!tab2)
            continue;
        *tab1 = *tab2 = '\0';
        if (strcmp(line, info->name) || strcmp(tab1 + 1, info->driver_version))
            continue;
        castle_tuning t = *out;
        if (!tab2[1] || parse_over(tab2 + 1, &t)) /* an empty tuning is malformed, as CASTLE_TUNING="" is unset */
            continue;
        castle__tuning_resolve(&t, info);
        if (castle__tuning_check(&t, info) == CASTLE_SUCCESS) {
            *out = t;
            found = true;
        }
    }
    fclose(f);
    castle__clear_error(); /* a rejected entry is not the caller's error */
    return found;
}

castle_status castle__tuning_select(const castle_device_info *info, castle_tuning *out, const char **name)
{
    const size_t n = sizeof table / sizeof table[0];
    const tuning_entry *pick = &table[n - 1];
    for (size_t i = 0; i < n; ++i) {
        const tuning_entry *e = &table[i];
        if (!(e->type & info->type))
            continue;
        if (e->vendor && !strstr(info->vendor, e->vendor))
            continue;
        if (e->device && !strstr(info->name, e->device))
            continue;
        pick = e;
        break;
    }
    castle__tuning_normalize(out, &pick->tuning);
    castle__tuning_resolve(out, info); /* what the entry leaves to derive (decode) */
    *name = pick->name;
    /* Devices with little local memory or small work-groups: the largest block, then the largest
       d chunk, that fits; threads halved until they fit the block and the device, the micro-tile
       narrowed to fit the smaller block. */
    if (castle__tuning_check(out, info) != CASTLE_SUCCESS) {
        const castle_tuning entry = *out;
        bool fits = false;
        for (unsigned b = entry.block; b >= 8 && !fits; b /= 2)
            for (unsigned c = entry.dchunk; c >= 4 && !fits; c /= 2) {
                castle_tuning t = entry;
                t.block = b;
                t.dchunk = c;
                t.vector = t.tm = t.tn = 0;
                t.decode = pick->tuning.decode; /* re-derived with the vector unless the entry names it */
                t.stage = pick->tuning.stage;   /* re-derived with decode unless the entry names it */
                t.threads = b; /* the fewest work-items: the tile narrowed for them fits any more */
                castle__tuning_resolve(&t, info);
                if (t.decode == 2 && info->max_work_group_size < 128)
                    t.decode = 1; /* the decode mapping of teams needs work-groups of 128 */
                t.threads = entry.threads;
                while (t.threads > b && (t.threads > info->max_work_group_size || !tile_fits(&t)))
                    t.threads /= 2;
                if (t.threads < b)
                    t.threads = b;
                t.bthreads = t.fthreads = t.threads; /* the backward and the forward take the shrunk shape */
                t.btm = t.tm;
                t.fdchunk = c;
                if (castle__tuning_check(&t, info) == CASTLE_SUCCESS) {
                    *out = t;
                    fits = true;
                }
            }
        *name = "shrunk";
    }
    /* a tuning file's line or CASTLE_TUNING may still give a device that no built-in shape fits one */
    bool fits = castle__tuning_check(out, info) == CASTLE_SUCCESS;
    if (from_file(info, out)) {
        *name = "file";
        fits = true; /* from_file takes only a line that passes castle__tuning_check */
    }
    const char *env = getenv("CASTLE_TUNING");
    if (!fits && !(env && *env))
        return castle__fail(CASTLE_ERR_DEVICE_UNSUPPORTED,
                            "device '%s' has too little local memory (%llu bytes) or too small work-groups (%zu) "
                            "for any built-in tuning (CASTLE_TUNING or a tuning file may name one that fits)",
                            info->name, (unsigned long long)info->local_mem_size, info->max_work_group_size);
    if (env && *env) {
        castle_tuning t = *out;
        const char *bad = parse_over(env, &t);
        if (bad)
            return castle__fail(CASTLE_ERR_BAD_TUNING,
                                "CASTLE_TUNING='%s' is malformed at '%s' (a key, '=', decimal digits, then a comma "
                                "and the next key or the end): expected e.g. "
                                "'block=32,threads=64,dchunk=16,vector=4,tm=2,tn=1,fold=8,decode=2'",
                                env, bad);
        castle__tuning_resolve(&t, info);
        castle_status st = castle__tuning_check(&t, info);
        if (st != CASTLE_SUCCESS)
            return st;
        *out = t;
        *name = "environment";
    }
    castle__tuning_normalize(out, out);
    castle__clear_error(); /* candidates rejected on the way are not the caller's error */
    return CASTLE_SUCCESS;
}
