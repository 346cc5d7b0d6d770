/* pi2.h — the one public header of pi2's C core; the only header Python binds (cffi API mode).
 * Owns: status codes, the ABI version and error reporting.
 * Lines starting with '#' are stripped before ffi.cdef, so keep declarations free of macros. */
#ifndef PI2_H
#define PI2_H
#include <stdint.h>
#include <stddef.h>

typedef enum {
    PI2_OK = 0,
    PI2_ERR_INVALID = -1,     /* a bad argument */
    PI2_ERR_IO = -2,          /* a read failed */
    PI2_ERR_NOMEM = -3,       /* an allocation failed */
    PI2_ERR_FORMAT = -4,      /* malformed model data */
    PI2_ERR_UNSUPPORTED = -5  /* a type or feature this build does not support */
} pi2_status;

/* Bumped whenever a declaration in this header changes; checked by pi2/engine.py at import. */
uint32_t pi2_abi_version(void);

/* The message of the last error on this thread ("" when none). */
const char *pi2_last_error(void);

#endif
