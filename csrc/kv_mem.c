/* kv_mem.c — the KV cache's memory: an anonymous mapping, so the cache starts on a page (calloc's large blocks start
 * 16 bytes into one) and, with rows of whole 64-byte lines (pi2_kv_k_ld), every row of the transposed F16 keys and
 * every 64-key block a score loop reads starts on a cache line: a block of 128 bytes then spans two lines, not three.
 * Zero pages until written, as calloc's.
 * Does not: decide the cache's size or layout (kv_quant.c, context.c). */
#define _GNU_SOURCE
#include "kv_mem.h"

#include <stdint.h>
#include <sys/mman.h>

void *pi2_kv_alloc(size_t bytes, size_t *mapped) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *mapped = bytes;
    return p;
}

void pi2_kv_release(void *p, size_t mapped) {
    if (p) munmap(p, mapped);
}
