/* pi2.c — library-wide entry points: ABI version and the per-thread last-error message.
 * Does not: compute anything (kernels/, forward.c) or read files (io/). */
#include "pi2.h"
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

#define PI2_ABI_VERSION 10u

static _Thread_local char last_error[512];

uint32_t pi2_abi_version(void) { return PI2_ABI_VERSION; }

const char *pi2_last_error(void) { return last_error; }

pi2_status pi2_set_error(pi2_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void pi2_clear_error(void) { last_error[0] = '\0'; }
