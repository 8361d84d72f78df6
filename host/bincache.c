/* On-disk cache of program binaries, keyed by a hash of (source, options, device name, driver
 * version, platform version, ...).  Directory: $CASTLE_CACHE_DIR, else $XDG_CACHE_HOME/castle,
 * else $HOME/.cache/castle; CASTLE_CACHE_DIR=off disables it.  Every failure (no directory, no
 * permission, a short or corrupt file) is silent: the caller simply compiles from source.
 *
 * An entry, <dir>/<key hash>.bin:  "CASTLEBIN2\0" | key hash (u64) | payload size (u64) |
 * payload checksum (u64) | payload (the driver's program binary), host byte order.  The checksum
 * is FNV-1a over the payload: a changed byte anywhere changes it, so a damaged binary is never
 * handed to the driver; such an entry is deleted and the caller rebuilds it. */
#define _POSIX_C_SOURCE 200809L
#include "bincache.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "CASTLEBIN2"

FILE *castle__open_regular(const char *path, size_t max, size_t *size, const char **why)
{
    const char *dummy;
    why = why ? why : &dummy;
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY); /* a FIFO's open would wait for a writer */
    if (fd < 0) {
        *why = strerror(errno);
        return NULL;
    }
    struct stat st;
    FILE *f = NULL;
    int e = 0;
    if (fstat(fd, &st) != 0)
        *why = strerror(e = errno);
    else if (S_ISDIR(st.st_mode))
        *why = "it is a directory", e = EISDIR;
    else if (!S_ISREG(st.st_mode))
        *why = "it is not a regular file", e = EINVAL;
    else if (st.st_size < 0 || (unsigned long long)st.st_size > max)
        *why = "it is larger than the library reads", e = EFBIG;
    else if (!(f = fdopen(fd, "rb")))
        *why = strerror(e = errno);
    if (!f) {
        close(fd);
        errno = e;
        return NULL;
    }
    if (size)
        *size = (size_t)st.st_size;
    return f;
}

/* FNV-1a: each step is a bijection of h for a fixed byte, so inputs that differ in one byte
   always hash differently. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; ++i) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

#define FNV_BASIS 14695981039346656037ull

uint64_t castle__bincache_checksum(const void *data, size_t n) { return fnv1a(FNV_BASIS, data, n); }

static uint64_t key_hash(const char *const *parts, int n)
{
    uint64_t h = FNV_BASIS;
    for (int i = 0; i < n; ++i) {
        size_t len = strlen(parts[i]);
        h = fnv1a(h, &len, sizeof len); /* length-prefixed: ("ab","c") != ("a","bc") */
        h = fnv1a(h, parts[i], len);
    }
    return h;
}

/* Writes the cache directory into buf (creating it); false when there is none. */
static bool cache_dir(char *buf, size_t n)
{
    const char *env = getenv("CASTLE_CACHE_DIR");
    int w;
    if (env && *env) {
        if (!strcmp(env, "off"))
            return false;
        w = snprintf(buf, n, "%s", env);
    } else if ((env = getenv("XDG_CACHE_HOME")) && *env) {
        w = snprintf(buf, n, "%s/castle", env);
    } else if ((env = getenv("HOME")) && *env) {
        char parent[4096];
        if (snprintf(parent, sizeof parent, "%s/.cache", env) >= (int)sizeof parent)
            return false;
        mkdir(parent, 0755);
        w = snprintf(buf, n, "%s/castle", parent);
    } else {
        return false;
    }
    if (w < 0 || (size_t)w >= n)
        return false;
    mkdir(buf, 0755);
    struct stat st;
    return stat(buf, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool entry_path(const char *const *parts, int n, char *buf, size_t len)
{
    char dir[4096];
    if (!cache_dir(dir, sizeof dir))
        return false;
    int w = snprintf(buf, len, "%s/%016llx.bin", dir, (unsigned long long)key_hash(parts, n));
    return w > 0 && (size_t)w < len;
}

bool castle__bincache_load(const char *const *parts, int nparts, unsigned char **bin, size_t *len)
{
    char path[4200];
    if (!entry_path(parts, nparts, path, sizeof path))
        return false;
    FILE *f = castle__open_regular(path, (size_t)1 << 31, NULL, NULL);
    if (!f) {
        /* something that is no entry at this path (a directory left empty, a FIFO, a file larger
           than any entry) goes, so that the entry can be stored again; a missing file is the usual
           miss, and an entry this process may not read (another user's) or could not open now (no
           file descriptor left) stays: it may be good */
        if (errno == EISDIR || errno == EINVAL || errno == EFBIG)
            remove(path);
        return false;
    }
    char magic[sizeof MAGIC];
    uint64_t hash = 0, size = 0, sum = 0;
    bool ok = fread(magic, 1, sizeof magic, f) == sizeof magic && !memcmp(magic, MAGIC, sizeof magic) &&
              fread(&hash, sizeof hash, 1, f) == 1 && hash == key_hash(parts, nparts) &&
              fread(&size, sizeof size, 1, f) == 1 && size > 0 && size < (1ull << 30) &&
              fread(&sum, sizeof sum, 1, f) == 1;
    unsigned char *data = ok ? malloc((size_t)size) : NULL;
    const bool no_memory = ok && !data;
    ok = data && fread(data, 1, (size_t)size, f) == size && fgetc(f) == EOF &&
         castle__bincache_checksum(data, (size_t)size) == sum;
    fclose(f);
    if (!ok) {
        free(data);
        /* Writers publish entries by rename, so a file at this path is complete: one that does not
           check out is damaged (or of an older format) and goes. */
        if (!no_memory)
            remove(path);
        return false;
    }
    *bin = data;
    *len = (size_t)size;
    return true;
}

void castle__bincache_discard(const char *const *parts, int nparts)
{
    char path[4200];
    if (entry_path(parts, nparts, path, sizeof path))
        remove(path);
}

void castle__bincache_store(const char *const *parts, int nparts, const unsigned char *bin, size_t len)
{
    char path[4200], tmp[4300];
    if (!entry_path(parts, nparts, path, sizeof path))
        return;
    /* A name no other writer has (the process id, and a counter for this process's threads),
       created exclusively, so concurrent stores never share a temporary file; a name left by a
       writer that died is skipped.  Mode 0644 less the umask, as for any file the user makes, so
       that the users of a shared cache directory read each other's entries (mkstemp's 0600 made
       each user delete the others' and compile again). */
    static atomic_uint counter;
    int fd = -1;
    for (int tries = 0; tries < 64 && fd < 0; ++tries) {
        const unsigned n = atomic_fetch_add(&counter, 1u);
        if (snprintf(tmp, sizeof tmp, "%s.%ld.%u.tmp", path, (long)getpid(), n) >= (int)sizeof tmp)
            return;
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0644);
        if (fd < 0 && errno != EEXIST)
            return;
    }
    if (fd < 0)
        return;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        remove(tmp);
        return;
    }
    uint64_t hash = key_hash(parts, nparts), size = len, sum = castle__bincache_checksum(bin, len);
    bool ok = fwrite(MAGIC, 1, sizeof MAGIC, f) == sizeof MAGIC && fwrite(&hash, sizeof hash, 1, f) == 1 &&
              fwrite(&size, sizeof size, 1, f) == 1 && fwrite(&sum, sizeof sum, 1, f) == 1 &&
              fwrite(bin, 1, len, f) == len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) /* rename is atomic: readers see the old entry or the new one */
        remove(tmp);
}
