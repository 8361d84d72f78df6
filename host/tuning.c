/* The per-device tuning table (vendor -> device -> default) and its checks. */
#include "tuning.h"
#include "error.h"

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
   devices named; how a tuning is chosen and overridden: docs/building.md, "Tuning". */
static const tuning_entry table[] = {
    {"pocl-cpu", NULL, "pthread", CL_DEVICE_TYPE_CPU, {32, 64, 32, 16, 8}},
    {"cpu", NULL, NULL, CL_DEVICE_TYPE_CPU, {32, 64, 32, 16, 8}},
    {"nvidia-gpu", "NVIDIA", NULL, CL_DEVICE_TYPE_GPU, {32, 256, 32, 1, 8}},
    {"default", NULL, NULL, CL_DEVICE_TYPE_ALL, {32, 256, 32, 1, 8}},
};

/* The table's vector width for the device (what vector = 0 stands for). */
static unsigned default_vector(const castle_device_info *info)
{
    return (info && (info->type & CL_DEVICE_TYPE_CPU)) ? 16u : 1u;
}

/* Replaces vector = 0 by the device's default, narrowed until it divides block and dchunk. */
void castle__tuning_resolve(castle_tuning *t, const castle_device_info *info)
{
    if (t->vector)
        return;
    unsigned v = default_vector(info);
    const unsigned n = t->threads ? t->threads : 1;
    while (v > 1 && (t->block % v || t->dchunk % v || (t->block * t->block / v) % n || (t->block * t->dchunk / v) % n))
        v = v == 4 ? 1 : v / 2;
    t->vector = v;
}

size_t castle__tuning_local_bytes(const castle_tuning *t)
{
    /* The largest of LM_SIZE in cl/forward.cl and LM_BW in cl/backward.cl. */
    const size_t ts = t->dchunk + 1, bp = t->block + 1, b = t->block;
    const size_t p1 = 2 * b * ts + 4 * t->dchunk * b;
    const size_t p2 = 4 * b * b + 2 * b + 2 * b * t->dchunk;
    const size_t tile = b * ts > t->dchunk * bp ? b * ts : t->dchunk * bp;
    const size_t bw = 9 * b * bp + 7 * tile + 2 * b;
    size_t m = p1 > p2 ? p1 : p2;
    /* cl/causal.cl: BLK (CC_TROWS + DT + 2 BLK + 3) bounds each of its kernels, with the transposed
       tile CC_TROWS = min(256, 4 (BLK + DT)) columns wide: never above bw. */
    const size_t trows = 4 * (b + t->dchunk) < CASTLE_MAX_HEAD_DIM ? 4 * (b + t->dchunk) : CASTLE_MAX_HEAD_DIM;
    const size_t causal = b * (trows + t->dchunk + 2 * b + 3);
    m = m > causal ? m : causal;
    return 4 * (m > bw ? m : bw);
}

castle_status castle__tuning_check(const castle_tuning *t, const castle_device_info *info)
{
    const unsigned b = t->block, n = t->threads, c = t->dchunk;
    if (b != 8 && b != 16 && b != 32 && b != 64)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning block=%u: must be 8, 16, 32 or 64", b);
    if (c != 4 && c != 8 && c != 16 && c != 32 && c != 64)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning dchunk=%u: must be 4, 8, 16, 32 or 64", c);
    const unsigned v = t->vector;
    if (v != 1 && v != 4 && v != 8 && v != 16)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning vector=%u: must be 1, 4, 8 or 16", v);
    if (b % v || c % v)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning vector=%u must divide block=%u and dchunk=%u", v, b, c);
    if (n && ((b * b / v) % n || (b * c / v) % n))
        return castle__fail(CASTLE_ERR_BAD_TUNING,
                            "tuning threads=%u x vector=%u must divide block*block=%u and block*dchunk=%u", n, v, b * b,
                            b * c);
    if (t->fold > 1024)
        return castle__fail(CASTLE_ERR_BAD_TUNING, "tuning fold=%u: must be at most 1024", t->fold);
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

/* Parses "block=32,threads=64,dchunk=32,vector=8,fold=8" over *t.  Returns false on a malformed string. */
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
        else if (!strcmp(key, "vector"))
            t->vector = val;
        else if (!strcmp(key, "fold"))
            t->fold = val;
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
   "<device name>\t<driver version>\tblock=..,threads=..,dchunk=..,vector=.."; '#' starts a comment.
   An unreadable file or a malformed or unfitting entry is ignored. */
static bool from_file(const castle_device_info *info, castle_tuning *out)
{
    char path[4096], line[1024];
    if (!castle__tuning_file_path(path, sizeof path))
        return false;
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
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
        t.vector = 0;
        if (!parse_env(tab2 + 1, &t))
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
    *out = pick->tuning;
    *name = pick->name;
    /* Devices with little local memory or small work-groups: the largest block, then the largest
       d chunk, that fits; threads halved until they fit the block and the device. */
    if (castle__tuning_check(out, info) != CASTLE_SUCCESS) {
        const castle_tuning entry = *out;
        bool fits = false;
        for (unsigned b = entry.block; b >= 8 && !fits; b /= 2)
            for (unsigned c = entry.dchunk; c >= 4 && !fits; c /= 2) {
                castle_tuning t = entry;
                t.block = b;
                t.dchunk = c;
                t.vector = 0;
                castle__tuning_resolve(&t, info);
                while (t.threads > b && (t.threads > info->max_work_group_size || (b * b) % t.threads ||
                                         (b * c) % t.threads))
                    t.threads /= 2;
                if (t.threads < b)
                    t.threads = b;
                if (castle__tuning_check(&t, info) == CASTLE_SUCCESS) {
                    *out = t;
                    fits = true;
                }
            }
        *name = "shrunk";
    }
    if (castle__tuning_check(out, info) != CASTLE_SUCCESS)
        return castle__fail(CASTLE_ERR_DEVICE_UNSUPPORTED,
                            "device '%s' has too little local memory (%llu bytes) or too small work-groups (%zu) "
                            "for any tuning",
                            info->name, (unsigned long long)info->local_mem_size, info->max_work_group_size);
    if (from_file(info, out))
        *name = "file";
    const char *env = getenv("CASTLE_TUNING");
    if (env && *env) {
        castle_tuning t = *out;
        t.vector = 0; /* re-derived for the new block and dchunk unless given */
        if (!parse_env(env, &t))
            return castle__fail(CASTLE_ERR_BAD_TUNING,
                                "CASTLE_TUNING='%s' is malformed: expected e.g. 'block=32,threads=256,dchunk=32,vector=8,fold=8'",
                                env);
        castle__tuning_resolve(&t, info);
        castle_status st = castle__tuning_check(&t, info);
        if (st != CASTLE_SUCCESS)
            return st;
        *out = t;
        *name = "environment";
    }
    castle__clear_error(); /* candidates rejected on the way are not the caller's error */
    return CASTLE_SUCCESS;
}
