/* Error reporting (lib/error.c): the per-thread message behind castle_last_error(). */
#ifndef CASTLE_LIB_ERROR_H
#define CASTLE_LIB_ERROR_H

#include "castle/castle.h"

/* Records a formatted message for castle_last_error() and returns status. */
castle_status castle__fail(castle_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void castle__clear_error(void);
/* Wraps an OpenCL error code from call `what` (status passes through unchanged). */
castle_status castle__cl_fail(cl_int err, const char *what);

#endif
