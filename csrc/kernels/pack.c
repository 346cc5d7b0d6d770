/* pack.c — the x8 repacked layout of pack.h: pack and unpack, field by field (the scalar twin of
 * pi2/quants.py pack_rows), and the once-filled CPU variant (the one pi2_cpu_variant_request asked for).
 * Does not: compute or choose kernels. */
#include "pack.h"
#include "../internal.h"
#include "traits.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>

int pi2_pack_fields(int32_t type, int32_t f[4]) {
    switch (type) {
    case PI2_T_Q4_0: f[0] = 2; f[1] = 16; return 2;
    case PI2_T_Q4_1: f[0] = 2; f[1] = 2; f[2] = 16; return 3;
    case PI2_T_Q5_0: f[0] = 2; f[1] = 4; f[2] = 16; return 3;
    case PI2_T_Q5_1: f[0] = 2; f[1] = 2; f[2] = 4; f[3] = 16; return 4;
    case PI2_T_Q8_0: f[0] = 2; f[1] = 32; return 2;
    }
    return pi2_pack_k_fields(type, f);   /* the K-quants' layout (pack_k.c) */
}

/* memcpy of the field sizes there are, each a constant size (moves, not calls). */
static inline void copy_field(uint8_t *dst, const uint8_t *src, int32_t n) {
    switch (n) {
    case 2: memcpy(dst, src, 2); break;
    case 4: memcpy(dst, src, 4); break;
    case 16: memcpy(dst, src, 16); break;
    case 32: memcpy(dst, src, 32); break;
    default: memcpy(dst, src, (size_t)n);
    }
}

/* One group: plain rows (row_bytes apart) <-> packed bytes, in the direction `pack`. */
static void convert_group(int32_t type, uint8_t *plain, size_t row_bytes, uint8_t *packed, int64_t n_blocks, int pack) {
    int32_t f[4];
    const int nf = pi2_pack_fields(type, f);
    int32_t ts = 0;
    for (int k = 0; k < nf; k++) ts += f[k];
    for (int64_t i = 0; i < n_blocks; i++) {
        uint8_t *col = packed + (size_t)i * PI2_PACK_ROWS * (size_t)ts;
        int32_t off = 0;
        for (int k = 0; k < nf; k++) {
            for (int r = 0; r < PI2_PACK_ROWS; r++) {
                uint8_t *p = plain + (size_t)r * row_bytes + (size_t)i * (size_t)ts + (size_t)off;
                uint8_t *q = col + (size_t)off * PI2_PACK_ROWS + (size_t)r * (size_t)f[k];
                if (pack) copy_field(q, p, f[k]);
                else copy_field(p, q, f[k]);
            }
            off += f[k];
        }
    }
}

void pi2_pack_rows(int32_t type, const uint8_t *src, int64_t n_rows, int64_t n_blocks, uint8_t *dst) {
    int32_t f[4];
    if (pi2_pack_k_fields(type, f)) {
        pi2_pack_k_rows(type, src, n_rows, n_blocks, dst);
        return;
    }
    const int nf = pi2_pack_fields(type, f);
    size_t ts = 0;
    for (int k = 0; k < nf; k++) ts += (size_t)f[k];
    const size_t rb = (size_t)n_blocks * ts;
    for (int64_t g = 0; g < n_rows / PI2_PACK_ROWS; g++)
        convert_group(type, (uint8_t *)src + (size_t)g * PI2_PACK_ROWS * rb, rb, dst + (size_t)g * PI2_PACK_ROWS * rb,
                      n_blocks, 1);
}

void pi2_unpack_group(int32_t type, const uint8_t *group, int64_t n_blocks, uint8_t *dst, size_t row_bytes) {
    int32_t f[4];
    if (pi2_pack_k_fields(type, f)) {
        pi2_unpack_k_group(type, group, n_blocks, dst, row_bytes);
        return;
    }
    convert_group(type, dst, row_bytes, (uint8_t *)group, n_blocks, 0);
}

static pi2_cpu_variant variant;
static pthread_once_t variant_once = PTHREAD_ONCE_INIT;
static char requested[48];          /* pi2_cpu_variant_request's name ("": the CPU's own choice) */
static atomic_int chosen;           /* 1 once variant_init ran */

static void variant_init(void) {
    const char *want = requested[0] ? requested : NULL;
    atomic_store(&chosen, 1);
    variant.allow_ext = 1;
    if (!pi2_kernels_variant_x86(&variant, want) && !pi2_kernels_variant_neon(&variant, want)) {
        snprintf(variant.name, sizeof variant.name, "ref");
        snprintf(variant.why, sizeof variant.why, "no SIMD kernels for this CPU: scalar reference");
        if (want)
            snprintf(variant.error, sizeof variant.error, "PI2_CPU_VARIANT=%.40s: this CPU has only the scalar "
                     "kernels (accepted: auto)", want);
    }
}

const pi2_cpu_variant *pi2_kernels_variant(void) {
    pthread_once(&variant_once, variant_init);
    return &variant;
}

pi2_status pi2_cpu_variant_request(const char *want) {
    if (want && (!*want || !strcmp(want, "auto"))) want = NULL;
    if (atomic_load(&chosen)) {
        if (!strcmp(want ? want : "", requested)) return PI2_OK;
        return pi2_set_error(PI2_ERR_INVALID, "the CPU variant was already chosen (%s): ask before the first "
                             "kernel call", variant.name);
    }
    snprintf(requested, sizeof requested, "%s", want ? want : "");
    return PI2_OK;
}
