/* internal.h — declarations shared by pi2's C files but not part of the API (pi2.h): the error record, and the
 * test header's entry points (pi2_test.h), which the engine's own files call too (the flash reads, the ops). */
#ifndef PI2_INTERNAL_H
#define PI2_INTERNAL_H
#include "pi2.h"
#include "pi2_test.h"

/* Record a printf-style message for pi2_last_error() and return `status` (errno and path cleared). */
pi2_status pi2_set_error(pi2_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same for PI2_ERR_IO, with the errno of the failed call or read and the file it read. */
pi2_status pi2_set_io_error(int sys_errno, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pi2_clear_error(void);

/* kernels/api.c: the CPU's PI2_ISA_* bits, and one type's facts (pi2_kernel_info adds the bits). */
uint32_t pi2_kernel_isa(void);
pi2_status pi2_kernel_type_info(int32_t type, int32_t impl, pi2_type_info *out);

#endif
