/* The per-device tuning table (vendor -> device -> default) and its checks. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct tuning_entry {
    const char *name;
    const char *vendor; /* substring of CL_DEVICE_VENDOR, NULL = any */
    const char *device; /* substring of CL_DEVICE_NAME, NULL = any */
    cl_device_type type;
    castle_tuning tuning;
} tuning_entry;

/* First match wins; the last entry is the default.  Values were measured with castle-bench on the
   devices named; see README "Tuning". */
static const tuning_entry table[] = {
    {"pocl-cpu", NULL, "pthread", CL_DEVICE_TYPE_CPU, {32, 64, 32}},
    {"cpu", NULL, NULL, CL_DEVICE_TYPE_CPU, {32, 64, 32}},
    {"nvidia-gpu", "NVIDIA", NULL, CL_DEVICE_TYPE_GPU, {32, 256, 32}},
    {"default", NULL, NULL, CL_DEVICE_TYPE_ALL, {32, 256, 32}},
};

size_t castle__tuning_local_bytes(const castle_tuning *t)
{
    /* The largest of LM_SIZE in cl/forward.cl and LM_BW in cl/backward.cl. */
    const size_t ts = t->dchunk + 1, bp = t->block + 1, b = t->block;
    const size_t p1 = 6 * b * ts;
    const size_t p2 = 3 * b * bp + 2 * b + 2 * b * ts;
    const size_t bw = 6 * b * bp + 6 * b * ts + 2 * b;
    size_t m = p1 > p2 ? p1 : p2;
    return 4 * (m > bw ? m : bw);
}

castle_status castle__tuning_check(const castle_tuning *t, const castle_device_info *info)
{
    const unsigned b = t->block, n = t->threads, c = t->dchunk;
    if (b != 8 && b != 16 && b != 32 && b != 64)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning block=%u: must be 8, 16, 32 or 64", b);
    if (c != 4 && c != 8 && c != 16 && c != 32 && c != 64)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning dchunk=%u: must be 4, 8, 16, 32 or 64", c);
    if (n == 0 || n % b || (b * b) % n || (b * c) % n)
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning threads=%u: must be a multiple of block=%u dividing block*block=%u and "
                            "block*dchunk=%u",
                            n, b, b * b, b * c);
    if (info && n > info->max_work_group_size)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning threads=%u exceeds the device's max work-group size %zu", n,
                            info->max_work_group_size);
    size_t lb = castle__tuning_local_bytes(t);
    if (info && lb > info->local_mem_size)
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning block=%u dchunk=%u needs %zu bytes of local memory; the device has %llu", b, c, lb,
                            (unsigned long long)info->local_mem_size);
    return CASTLE_SUCCESS;
}

/* Parses "block=32,threads=64,dchunk=32" over *t.  Returns false on a malformed string. */
static bool parse_env(const char *s, castle_tuning *t)
{
    while (*s) {
        char key[16];
        unsigned val;
        int used = 0;
        if (sscanf(s, "%15[a-z]=%u%n", key, &val, &used) != 2 || used == 0)
            return false;
        if (!strcmp(key, "block"))
            t->block = val;
        else if (!strcmp(key, "threads"))
            t->threads = val;
        else if (!strcmp(key, "dchunk"))
            t->dchunk = val;
        else
            return false;
        s += used;
        if (*s == ',')
            ++s;
        else if (*s)
            return false;
    }
    return true;
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
    *out = pick->tuning;
    *name = pick->name;
    /* Devices with little local memory or small work-groups: shrink until the entry fits. */
    while (castle__tuning_check(out, info) != CASTLE_SUCCESS && (out->dchunk > 4 || out->block > 8 || out->threads > out->block)) {
        if (out->threads > out->block && out->threads > info->max_work_group_size)
            out->threads /= 2;
        else if (out->dchunk > 4)
            out->dchunk /= 2;
        else if (out->block > 8) {
            out->block /= 2;
            if (out->threads > out->block * out->block)
                out->threads = out->block * out->block;
        } else
            out->threads /= 2;
        *name = "shrunk";
    }
    const char *env = getenv("CASTLE_TUNING");
    if (env && *env) {
        castle_tuning t = *out;
        if (!parse_env(env, &t))
            return castle__fail(CASTLE_ERR_BAD_TUNING,
                                "CASTLE_TUNING='%s' is malformed: expected e.g. 'block=32,threads=64,dchunk=32'", env);
        castle_status st = castle__tuning_check(&t, info);
        if (st != CASTLE_SUCCESS)
            return st;
        *out = t;
        *name = "environment";
    }
    return castle__tuning_check(out, info);
}
