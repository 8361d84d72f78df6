/* The per-device tuning table, its checks and the tuning file (host/tuning.c). */
#ifndef CASTLE_HOST_TUNING_H
#define CASTLE_HOST_TUNING_H

#include "device.h"

#include <stdbool.h>
#include <stddef.h>

/* Picks the built-in entry for the device and applies CASTLE_TUNING.  name receives the entry's name. */
castle_status castle__tuning_select(const castle_device_info *info, castle_tuning *out, const char **name);
/* The per-device tuning file: $CASTLE_TUNING_FILE, else $XDG_CONFIG_HOME/castle/tuning.tsv, else
   ~/.config/castle/tuning.tsv.  False when no path can be formed. */
bool castle__tuning_file_path(char *buf, size_t n);
/* Replaces vector = 0 by the device's default width, narrowed until it divides block and dchunk. */
void castle__tuning_resolve(castle_tuning *t, const castle_device_info *info);
/* Checks a tuning against the rules of castle.h and the device limits. */
castle_status castle__tuning_check(const castle_tuning *t, const castle_device_info *info);
/* Bytes of local memory the kernels need under t. */
size_t castle__tuning_local_bytes(const castle_tuning *t);

#endif
