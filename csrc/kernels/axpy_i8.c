/* axpy_i8.c — ggml type I8 (plain int8 rows, 24): to_float, and the grouped row sum of int8 down rows
 * (traits field axpy_group) as an integer scheme, not the float term-by-term sum of axpy.c:
 *   m = max_i |p_i|; nothing changes if k = 0 or !(m > 0); iS = 127/m, S = m/127 (float divisions);
 *   z_i = (int32) nearbyint(p_i·iS)   (float product, half to even; |z_i| ≤ 127)
 *   y[j] = y[j] + S·(float) Σ_i z_i·q_i[j]   (an exact int32 sum; one float product, one float sum)
 * for j < n (any n ≥ 1), q_i the int8 row at rows + idx[i]·row_bytes (values in [-127, 127], never -128),
 * p_i = h_i·scale_i with the row's scale already applied by the caller, k ≤ 64 (PI2_FFN_GROUP).
 * Does: the I8 row of the reference table (to_float, the scalar kernel); pi2_kernels_install_axpy_i8
 *       puts the fast kernels a table's ISA allows in it (none yet).
 * Does not: multiply rows with activations (I8 has no vec_dot nor activation format) or keep scales. */
#include "traits.h"

#include <math.h>

#define I8_MAX_K 64

/* One call's rows and weights, k rounded up to a multiple of 4 (padding: z = 0 on row idx[0]). */
typedef struct {
    const int8_t *r[I8_MAX_K + 3];
    union { int8_t z[I8_MAX_K + 3]; int32_t zq[(I8_MAX_K + 3) / 4 + 1]; };   /* zq: z in quads */
    int32_t k, kp, zsum;
    float S;
} i8_group;

/* z, S and the row pointers; 0 when y stays as it is. */
static int i8_prepare(i8_group *g, const void *rows, size_t rb, const int32_t *idx, const float *p, int32_t k) {
    float m = 0.0f;
    for (int32_t i = 0; i < k; i++) {
        const float a = fabsf(p[i]);
        if (a > m) m = a;
    }
    if (k <= 0 || !(m > 0.0f)) return 0;
    const float iS = 127.0f / m;
    g->S = m / 127.0f;
    g->k = k, g->kp = (k + 3) & ~3, g->zsum = 0;
    for (int32_t i = 0; i < g->kp; i++) {
        const int32_t z = i < k ? (int32_t)nearbyintf(p[i] * iS) : 0;
        g->z[i] = (int8_t)z;
        g->zsum += z;
        g->r[i] = (const int8_t *)rows + (size_t)idx[i < k ? i : 0] * rb;
    }
    return 1;
}

/* Columns [j0, n) one at a time: the reference's sum, and every fast kernel's tail. */
static void i8_cols(const i8_group *g, int64_t j0, int64_t n, float *y) {
    for (int64_t j = j0; j < n; j++) {
        int32_t acc = 0;
        for (int32_t i = 0; i < g->k; i++) acc += (int32_t)g->z[i] * g->r[i][j];
        y[j] = y[j] + g->S * (float)acc;
    }
}

static void i8_to_float(const void *src, float *y, int64_t n) {
    const int8_t *q = src;
    for (int64_t i = 0; i < n; i++) y[i] = (float)q[i];
}

static void axpy_i8_ref(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *p,
                        int32_t k) {
    i8_group g;
    if (i8_prepare(&g, rows, rb, idx, p, k)) i8_cols(&g, 0, n, y);
}

void pi2_kernels_fill_axpy_i8(pi2_type_traits *tab) {
    tab[PI2_T_I8] = (pi2_type_traits){.name = "I8", .block_size = 1, .type_size = 1, .vec_dot_type = PI2_T_I8,
                                      .to_float = i8_to_float, .axpy_group = axpy_i8_ref};
}

void pi2_kernels_install_axpy_i8(pi2_type_traits *tab, uint32_t isa) { (void)tab; (void)isa; }
