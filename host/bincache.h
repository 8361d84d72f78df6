/* The on-disk program-binary cache (host/bincache.c). */
#ifndef CASTLE_HOST_BINCACHE_H
#define CASTLE_HOST_BINCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Key parts are hashed together; returns false (silently) when there is no usable entry.  An entry
   whose payload fails its checksum (or is otherwise damaged) is deleted. */
bool castle__bincache_load(const char *const *key_parts, int nparts, unsigned char **bin, size_t *len);
void castle__bincache_store(const char *const *key_parts, int nparts, const unsigned char *bin, size_t len);
/* Deletes the entry: the driver rejected the binary it holds. */
void castle__bincache_discard(const char *const *key_parts, int nparts);
/* The checksum an entry stores over its payload. */
uint64_t castle__bincache_checksum(const void *data, size_t n);

#endif
