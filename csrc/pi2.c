/* pi2.c — library-wide entry points: ABI version, the per-thread last error, kernel facts.
 * Does not: compute anything (kernels/, forward.c) or read files (io/). */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_message[512];
static _Thread_local char last_path[256];
static _Thread_local pi2_error last = {.size = sizeof(pi2_error)};

void pi2_last_error(pi2_error *out) {
    if (!out || !out->size) return;
    pi2_error e = last;
    e.message = last_message;
    e.path = last_path;
    e.size = out->size < sizeof e ? out->size : (uint32_t)sizeof e;
    memcpy(out, &e, e.size);
}

static pi2_status record(pi2_status status, int sys_errno, const char *path, const char *fmt, va_list ap) {
    vsnprintf(last_message, sizeof last_message, fmt, ap);
    snprintf(last_path, sizeof last_path, "%s", path ? path : "");
    last.status = status;
    last.sys_errno = sys_errno;
    return status;
}

pi2_status pi2_set_error(pi2_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(status, 0, NULL, fmt, ap);
    va_end(ap);
    return status;
}

pi2_status pi2_set_io_error(int sys_errno, const char *path, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(PI2_ERR_IO, sys_errno, path, fmt, ap);
    va_end(ap);
    return PI2_ERR_IO;
}

void pi2_clear_error(void) {
    last_message[0] = last_path[0] = '\0';
    last.status = PI2_OK;
    last.sys_errno = 0;
}

pi2_status pi2_kernel_info(int32_t type, int32_t impl, pi2_type_info *out) {
    const pi2_status s = pi2_kernel_type_info(type, impl, out);
    if (!s) out->isa = pi2_kernel_isa();
    return s;
}
