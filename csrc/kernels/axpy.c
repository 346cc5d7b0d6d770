/* axpy.c — the grouped row sums of the sparse FFN's down rows (traits field axpy_group):
 *   y[j] += (((+0 + h[0]·v_0[j]) + h[1]·v_1[j]) + ...) + h[k-1]·v_{k-1}[j]   for j < n,
 * v_i = row idx[i]'s values as to_float gives them, one float product and one float sum per term
 * (no FMA), so every implementation agrees bit for bit with the scalar one and with pi2/sparse.py.
 * Does: the reference kernel for every float-summed type (to_float, then the sums) and AVX2 kernels for
 *       the row types pi2 files use (Q8_0, F16, F32) that convert in registers and keep the partial sums of
 *       64 columns in registers across the group, an AVX-512 one (Q8_0) with 128 columns;
 *       pi2_kernels_install_axpy_x86 puts them in a table.
 * Does not: Q4_1 and Q5_1 rows, summed in integers (axpy_qx1.c), nor I8 rows (axpy_i8.c). */
#include "traits.h"

#define CHUNK 64   /* columns whose partial sums a kernel keeps in registers */

/* Reference: one block-aligned chunk of columns at a time (n is a multiple of the block size). */
static void axpy_group_ref(const pi2_type_traits *t, int64_t n, float *y, const uint8_t *rows, size_t row_bytes,
                           const int32_t *idx, const float *h, int32_t k) {
    const int64_t step = t->block_size >= CHUNK ? t->block_size : CHUNK / t->block_size * t->block_size;
    float v[256], p[256];
    for (int64_t j0 = 0; j0 < n; j0 += step) {
        const int64_t w = n - j0 < step ? n - j0 : step;
        const size_t off = (size_t)(j0 / t->block_size) * (size_t)t->type_size;
        for (int64_t j = 0; j < w; j++) p[j] = 0.0f;
        for (int32_t i = 0; i < k; i++) {
            t->to_float(rows + (size_t)idx[i] * row_bytes + off, v, w);
            for (int64_t j = 0; j < w; j++) p[j] += h[i] * v[j];
        }
        for (int64_t j = 0; j < w; j++) y[j0 + j] += p[j];
    }
}

#define REF_AXPY(T)                                                                                            \
    static void axpy_ref_##T(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *h, \
                             int32_t k) {                                                                      \
        axpy_group_ref(pi2_traits(T, PI2_K_IMPL_REF), n, y, rows, rb, idx, h, k);                            \
    }
REF_AXPY(PI2_T_F32) REF_AXPY(PI2_T_F16) REF_AXPY(PI2_T_BF16) REF_AXPY(PI2_T_Q4_0)
REF_AXPY(PI2_T_Q5_0) REF_AXPY(PI2_T_Q8_0) REF_AXPY(PI2_T_Q4_K) REF_AXPY(PI2_T_Q5_K)
REF_AXPY(PI2_T_Q6_K)

void pi2_kernels_fill_axpy_ref(pi2_type_traits *tab) {
    tab[PI2_T_F32].axpy_group = axpy_ref_PI2_T_F32;
    tab[PI2_T_F16].axpy_group = axpy_ref_PI2_T_F16;
    tab[PI2_T_BF16].axpy_group = axpy_ref_PI2_T_BF16;
    tab[PI2_T_Q4_0].axpy_group = axpy_ref_PI2_T_Q4_0;
    tab[PI2_T_Q5_0].axpy_group = axpy_ref_PI2_T_Q5_0;
    tab[PI2_T_Q8_0].axpy_group = axpy_ref_PI2_T_Q8_0;
    tab[PI2_T_Q4_K].axpy_group = axpy_ref_PI2_T_Q4_K;
    tab[PI2_T_Q5_K].axpy_group = axpy_ref_PI2_T_Q5_K;
    tab[PI2_T_Q6_K].axpy_group = axpy_ref_PI2_T_Q6_K;
}

#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,f16c")))

/* acc += h · v for 8 lanes, as two rounded operations */
#define TERM(acc, hv, v) (acc) = _mm256_add_ps((acc), _mm256_mul_ps((hv), (v)))

/* 8 int8 (signed) or uint8 at p as floats */
AVX2 static inline __m256 i8x8(const void *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

AVX2 static void axpy_q8_0_avx2(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx,
                                const float *h, int32_t k) {
    const uint8_t *base = rows;
    for (int64_t j0 = 0; j0 < n; j0 += CHUNK) {
        const int nb = n - j0 >= CHUNK ? 2 : 1;   /* 32-value blocks in this chunk */
        __m256 p[8];
        for (int r = 0; r < 8; r++) p[r] = _mm256_setzero_ps();
        const size_t off = (size_t)(j0 / 32) * sizeof(blk_q8_0);
        for (int32_t i = 0; i < k; i++) {
            const blk_q8_0 *b = (const blk_q8_0 *)(base + (size_t)idx[i] * rb + off);
            const __m256 hv = _mm256_set1_ps(h[i]);
            for (int q = 0; q < nb; q++) {
                const __m256 d = _mm256_set1_ps(pi2_fp16_to_f32(b[q].d));
                for (int r = 0; r < 4; r++) TERM(p[4 * q + r], hv, _mm256_mul_ps(i8x8(b[q].qs + 8 * r), d));
            }
        }
        for (int r = 0; r < 4 * nb; r++) _mm256_storeu_ps(y + j0 + 8 * r, _mm256_add_ps(_mm256_loadu_ps(y + j0 + 8 * r), p[r]));
    }
}

/* F32 and F16 rows: chunks of 64 columns, a tail of fewer (n is any multiple of 1) done 8 or 1 at a time */
#define AXPY_FLOAT(NAME, LOAD8, LOAD1, ELEM)                                                                     \
    AVX2 static void NAME(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx, const float *h, \
                          int32_t k) {                                                                       \
        const uint8_t *base = rows;                                                                          \
        int64_t j0 = 0;                                                                                      \
        for (; j0 + CHUNK <= n; j0 += CHUNK) {                                                               \
            __m256 p[8];                                                                                     \
            for (int r = 0; r < 8; r++) p[r] = _mm256_setzero_ps();                                          \
            for (int32_t i = 0; i < k; i++) {                                                                \
                const ELEM *x = (const ELEM *)(base + (size_t)idx[i] * rb) + j0;                             \
                const __m256 hv = _mm256_set1_ps(h[i]);                                                      \
                for (int r = 0; r < 8; r++) TERM(p[r], hv, LOAD8(x + 8 * r));                                 \
            }                                                                                                \
            for (int r = 0; r < 8; r++)                                                                      \
                _mm256_storeu_ps(y + j0 + 8 * r, _mm256_add_ps(_mm256_loadu_ps(y + j0 + 8 * r), p[r]));       \
        }                                                                                                    \
        for (; j0 < n; j0++) {                                                                               \
            float p = 0.0f;                                                                                  \
            for (int32_t i = 0; i < k; i++) p += h[i] * LOAD1((const ELEM *)(base + (size_t)idx[i] * rb) + j0); \
            y[j0] += p;                                                                                      \
        }                                                                                                    \
    }
#define F32_8(x) _mm256_loadu_ps(x)
#define F32_1(x) (*(x))
#define F16_8(x) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x)))
#define F16_1(x) pi2_fp16_to_f32(*(x))
AXPY_FLOAT(axpy_f32_avx2, F32_8, F32_1, float)
AXPY_FLOAT(axpy_f16_avx2, F16_8, F16_1, pi2_fp16)

/* ---- AVX-512: 16 lanes, partial sums of 128 columns (four blocks) in registers ---- */
#define AVX512 __attribute__((target("avx2,f16c,avx512f,avx512bw")))
#define TERM16(acc, hv, v) (acc) = _mm512_add_ps((acc), _mm512_mul_ps((hv), (v)))
#define CHUNK16 128

AVX512 static void axpy_q8_0_avx512(int64_t n, float *y, const void *rows, size_t rb, const int32_t *idx,
                                    const float *h, int32_t k) {
    const uint8_t *base = rows;
    for (int64_t j0 = 0; j0 < n; j0 += CHUNK16) {
        const int nb = n - j0 >= CHUNK16 ? 4 : (int)((n - j0) / 32);
        __m512 p[8];
        for (int r = 0; r < 8; r++) p[r] = _mm512_setzero_ps();
        const size_t off = (size_t)(j0 / 32) * sizeof(blk_q8_0);
        for (int32_t i = 0; i < k; i++) {
            const blk_q8_0 *b = (const blk_q8_0 *)(base + (size_t)idx[i] * rb + off);
            const __m512 hv = _mm512_set1_ps(h[i]);
            for (int q = 0; q < nb; q++) {
                const __m512 d = _mm512_set1_ps(pi2_fp16_to_f32(b[q].d));
                for (int r = 0; r < 2; r++) {
                    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b[q].qs + 16 * r))));
                    TERM16(p[2 * q + r], hv, _mm512_mul_ps(v, d));
                }
            }
        }
        for (int r = 0; r < 2 * nb; r++) _mm512_storeu_ps(y + j0 + 16 * r, _mm512_add_ps(_mm512_loadu_ps(y + j0 + 16 * r), p[r]));
    }
}


void pi2_kernels_install_axpy_x86(pi2_type_traits *tab, int allow_ext) {
    tab[PI2_T_Q8_0].axpy_group = axpy_q8_0_avx2;
    tab[PI2_T_F32].axpy_group = axpy_f32_avx2;
    tab[PI2_T_F16].axpy_group = axpy_f16_avx2;
    __builtin_cpu_init();
    if (allow_ext && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
        tab[PI2_T_Q8_0].axpy_group = axpy_q8_0_avx512;
    }
}
#else
void pi2_kernels_install_axpy_x86(pi2_type_traits *tab, int allow_ext) { (void)tab; (void)allow_ext; }
#endif
