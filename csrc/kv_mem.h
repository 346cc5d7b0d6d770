/* kv_mem.h — the KV cache's memory (kv_mem.c): page-aligned anonymous mappings. */
#ifndef PI2_KV_MEM_H
#define PI2_KV_MEM_H
#include <stddef.h>

/* bytes of zeroed memory starting on a page; *mapped: the length pi2_kv_release takes. NULL when the OS refuses. */
void *pi2_kv_alloc(size_t bytes, size_t *mapped);
/* Unmap what pi2_kv_alloc returned (NULL: nothing). */
void pi2_kv_release(void *p, size_t mapped);

#endif
