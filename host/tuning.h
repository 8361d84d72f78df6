/* The per-device tuning table, its checks, its parser and the tuning file (host/tuning.c). */
#ifndef CASTLE_HOST_TUNING_H
#define CASTLE_HOST_TUNING_H

#include "device.h"

#include <stdbool.h>
#include <stddef.h>

/* One entry of castle.h's CASTLE_TUNING_PARAMS, with the field's place in castle_tuning. */
typedef struct castle_tuning_param {
    const char *name;  /* field and key in CASTLE_TUNING and the tuning file */
    const char *macro; /* the kernels' -D macro, NULL when only the host uses it */
    size_t offset;     /* offsetof(castle_tuning, field) */
    unsigned lo, hi, flags;
} castle_tuning_param;
extern const castle_tuning_param castle__tuning_params[];
extern const size_t castle__tuning_nparams;
/* The field p of t, to write and to read. */
unsigned *castle__tuning_field(castle_tuning *t, const castle_tuning_param *p);
unsigned castle__tuning_get(const castle_tuning *t, const castle_tuning_param *p);

/* The largest tuning file read (bytes); a larger file is ignored. */
#define CASTLE__TUNING_FILE_MAX (1L << 20)

/* Picks the built-in entry for the device and applies CASTLE_TUNING.  name receives the entry's name. */
castle_status castle__tuning_select(const castle_device_info *info, castle_tuning *out, const char **name);
/* The built-in table, in match order (the last entry is the default): its size, and entry i
   (i < the size) into out, returning the entry's name. */
size_t castle__tuning_table_size(void);
const char *castle__tuning_table_entry(size_t i, castle_tuning *out);
/* The per-device tuning file: $CASTLE_TUNING_FILE, else $XDG_CONFIG_HOME/castle/tuning.tsv, else
   ~/.config/castle/tuning.tsv.  False when no path can be formed. */
bool castle__tuning_file_path(char *buf, size_t n);
/* Replaces vector, tm and tn = 0 by the device's mapping, narrowed until the micro-tile fits the
   block, the d chunk and the threads; then decode = 0 by 1 when vector > 1, else 2, the backward's
   bthreads, btm = 0 by threads, tm, and stage, accum = 0 by decode. */
void castle__tuning_resolve(castle_tuning *t, const castle_device_info *info);
/* Checks a tuning against the rules of castle.h and the device limits. */
castle_status castle__tuning_check(const castle_tuning *t, const castle_device_info *info);
/* Bytes of local memory the kernels need under t (cl/local_memory.h). */
size_t castle__tuning_local_bytes(const castle_tuning *t);
/* dst = src's parameters with struct_size = sizeof(castle_tuning) and every padding byte zero. */
void castle__tuning_normalize(castle_tuning *dst, const castle_tuning *src);

#endif
