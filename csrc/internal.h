/* internal.h — declarations shared by pi2's C files but not exposed to Python. */
#ifndef PI2_INTERNAL_H
#define PI2_INTERNAL_H
#include "pi2.h"

/* Record a printf-style message for pi2_last_error() and return `status`. */
pi2_status pi2_set_error(pi2_status status, const char *fmt, ...);
void pi2_clear_error(void);

#endif
