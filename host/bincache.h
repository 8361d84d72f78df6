/* The on-disk program-binary cache (host/bincache.c). */
#ifndef CASTLE_HOST_BINCACHE_H
#define CASTLE_HOST_BINCACHE_H

#include <stdbool.h>
#include <stddef.h>

/* Key parts are hashed together; returns false (silently) when there is no usable entry. */
bool castle__bincache_load(const char *const *key_parts, int nparts, unsigned char **bin, size_t *len);
void castle__bincache_store(const char *const *key_parts, int nparts, const unsigned char *bin, size_t len);

#endif
