/* The on-disk program-binary cache (host/bincache.c). */
#ifndef CASTLE_HOST_BINCACHE_H
#define CASTLE_HOST_BINCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Key parts are hashed together; returns false (silently) when there is no usable entry.  An entry
   whose payload fails its checksum (or is otherwise damaged) is deleted. */
bool castle__bincache_load(const char *const *key_parts, int nparts, unsigned char **bin, size_t *len);
void castle__bincache_store(const char *const *key_parts, int nparts, const unsigned char *bin, size_t len);
/* Deletes the entry: the driver rejected the binary it holds. */
void castle__bincache_discard(const char *const *key_parts, int nparts);
/* The checksum an entry stores over its payload. */
uint64_t castle__bincache_checksum(const void *data, size_t n);

/* The one way the library opens a file it reads (cache entries, the tuning file, CASTLE_CL_DIR's
   sources): only a regular file of at most max bytes is opened, its size into *size (may be NULL);
   a FIFO, a device or a directory is not read, and opening never blocks on one.  NULL otherwise,
   with a static description of why in *why (may be NULL) and errno set (ENOENT: no such file;
   EISDIR, EINVAL: a directory, another kind of file; EFBIG: larger than max). */
FILE *castle__open_regular(const char *path, size_t max, size_t *size, const char **why);

#endif
